"""One fuzz process: rounds of the chosen engine, rotating through every configuration, until the
budget is spent. Each distinct failure becomes a bucket with a shrunk trace, and is set aside for
the rest of the run (`harness.fuzz.buckets`); the run goes on unless `fail_fast`."""

from __future__ import annotations

import contextlib
import io
import os
import random
import resource
import time
from typing import Any, Dict, Optional, TextIO

from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.caches import cache_factory
from harness.engines.hypothesis_engine import machine_for, noted_trace_path
from harness.engines.random_engine import ProgramFailed, random_program
from harness.engines.shrink import shrink_saved
from harness.fuzz.buckets import SET_ASIDE_EVENT, Bucket, Claims, announce, new_bucket
from harness.fuzz.database import open_database
from harness.fuzz.options import FuzzOptions
from harness.fuzz.progress import Progress, Stats
from harness.profiles import register_profiles
from harness.signature import check_of

ROUND_EXAMPLES = 5  # small rounds: the budget is checked between rounds
# a failure is shrunk until the budget ends, or for this long if that is sooner: shrinking under
# the release's own scheduler replays the trace dozens of times, and ran 45 s budgets to minutes
MIN_SHRINK_SECONDS = 20.0
# Hypothesis finds the failing example; delta debugging shrinks its trace (Hypothesis' own
# shrinker takes minutes on these programs, ddmin seconds)
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


class Round:
    """What one round needs besides its configuration: the claims of every process, the
    set-aside the engines consult (it grows as buckets are found), and `stats`, whose
    `failures` are this process's buckets."""

    def __init__(self, options: FuzzOptions, factory, worker: int, claims: Claims, stats: Stats, out: TextIO, deadline: float):
        self.options, self.factory, self.worker, self.claims, self.stats, self.out = options, factory, worker, claims, stats, out
        self.set_aside = options.known_findings()
        self.deadline = deadline  # when the budget ends (`time.monotonic()`)
        # each configuration as this run draws it, settled once (`FuzzOptions.scenario`)
        self.scenarios = {name: options.scenario(name) for name in options.configs}

    def shrink_until(self) -> float:
        """When shrinking a failure found now stops: at the budget's end, but never sooner than
        `MIN_SHRINK_SECONDS` from now (a failure found late is still shrunk some)."""
        return max(self.deadline, time.monotonic() + MIN_SHRINK_SECONDS)

    def claim(self, signature) -> bool:
        """Whether this process shrinks and reports a failure with `signature`; either way it is
        set aside from now on. A failure another process claimed counts as set aside."""
        self.set_aside.add_signature(signature)
        if self.claims.claim(signature, self.worker):
            return True
        self.stats.record(SET_ASIDE_EVENT + signature.key)
        return False

    def found(self, signature, check: str, message: str, config: str, trace: Optional[str]) -> Bucket:
        bucket = new_bucket(signature, check, message, config, trace, self.factory, self.stats.started)
        self.stats.failures.append(bucket)
        announce(bucket, self.out)
        return bucket


def hypothesis_round(rnd: Round, machine, scenario_name: str, round_no: int, database) -> Optional[Bucket]:
    """Five state-machine examples of one configuration's machine; the bucket of a new failure."""
    options = rnd.options
    if options.seed is not None:
        machine._hypothesis_internal_use_seed = options.seed * 1_000_003 + round_no
    budget = settings(
        settings.get_profile(options.profile),
        max_examples=ROUND_EXAMPLES,
        database=database,
        derandomize=False,
        deadline=None,
        report_multiple_bugs=False,
        print_blob=False,
        phases=NO_SHRINK,
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            run_state_machine_as_test(machine, settings=budget)
    except Exception as exc:
        signature, path = getattr(exc, "harness_signature", None), noted_trace_path(exc)
        if signature is None:  # raised outside the machine's steps (Hypothesis itself, building the cache)
            raise
        if not rnd.claim(signature):
            if path is not None and os.path.exists(path):
                os.remove(path)
            return None
        if path is not None:
            path = shrink_saved(path, rnd.factory, options.trace_dir, rnd.shrink_until())
        return rnd.found(signature, check_of(exc), str(exc), scenario_name, path)
    return None


def random_round(rnd: Round, scenario_name: str, rng: random.Random, steps: int) -> Optional[Bucket]:
    """One random program of one configuration; the bucket of a new failure."""
    options = rnd.options
    try:
        random_program(rnd.scenarios[scenario_name], rnd.factory, rng, steps, options.device, options.trace_dir, rnd.stats.record,
                       options.protocol, rnd.set_aside, claim=rnd.claim, shrink_until=rnd.shrink_until())
    except ProgramFailed as failed:
        return rnd.found(failed.signature, failed.check, failed.message, scenario_name, failed.path)
    return None


def peak_rss_mib() -> float:
    """The process's peak resident memory so far, in MiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_single(options: FuzzOptions, out: TextIO, worker: int = 0, shared=None, stop=None,
               claims: Optional[Claims] = None) -> Dict[str, Any]:
    """One fuzz process: rotate through every configuration until the budget ends, or until
    `stop` (an event, see `harness.fuzz.stop`) is set, or with `fail_fast` a failure that fails
    the run. `claims` is shared with the other processes (`harness.fuzz.buckets`)."""
    register_profiles()
    factory = cache_factory(options.impl)
    stats = Stats()
    deadline = time.monotonic() + options.seconds
    progress = None if shared else Progress(options.seconds, out)

    def tick():
        if shared is not None:
            shared[worker] = (stats.programs, stats.steps, len(stats.failures))
        else:
            progress.show(stats.programs, stats.steps, len(stats.failures))

    stats.on_tick = tick
    rnd = Round(options, factory, worker, claims or Claims(), stats, out, deadline)
    database = open_database(options.db) if options.engine == "hypothesis" else None
    rng = random.Random(None if options.seed is None else options.seed * 7919 + worker)
    # one machine class per configuration for the whole run: Hypothesis keeps what it learns of a
    # machine class (its rules) for as long as the process lives, so a class a round would grow it
    machines = {
        name: machine_for(rnd.scenarios[name], factory, options.device, stats.record, trace_dir=options.trace_dir,
                          protocol=options.protocol, set_aside=rnd.set_aside)
        for name in options.configs
    } if options.engine == "hypothesis" else {}
    steps = settings.get_profile(options.profile).stateful_step_count
    round_no = worker
    started = time.monotonic()
    rss_after_first_round = None
    configs = list(options.configs)
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        rnd.claims.sync(rnd.set_aside)
        name = configs[round_no % len(configs)]
        if options.engine == "hypothesis":
            bucket = hypothesis_round(rnd, machines[name], name, round_no, database)
        else:
            bucket = random_round(rnd, name, rng, steps)
        round_no += 1
        if rss_after_first_round is None:
            rss_after_first_round = peak_rss_mib()
        tick()
        if bucket is not None and options.fail_fast and (options.fail_on_known or bucket.known is None):
            break
    elapsed = time.monotonic() - started
    if progress is not None:
        progress.show(stats.programs, stats.steps, len(stats.failures), final=True)
    set_aside_counts = {k[len(SET_ASIDE_EVENT):]: n for k, n in stats.labels.items() if k.startswith(SET_ASIDE_EVENT)}
    return {
        "programs": stats.programs,
        "steps": stats.steps,
        "elapsed_seconds": elapsed,
        "buckets": [b.to_json() for b in stats.failures],
        "set_aside_counts": set_aside_counts,
        "first_failure_programs": stats.first_failure_programs,
        "first_failure_seconds": stats.first_failure_seconds,
        "reach": {k: n for k, n in stats.labels.items() if not k.startswith(SET_ASIDE_EVENT)},
        "peak_rss_mib": peak_rss_mib(),
        "peak_rss_after_first_round_mib": rss_after_first_round,
    }
