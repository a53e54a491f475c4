"""One fuzz process: rounds of the chosen engine, rotating through the configurations, until the
budget is spent. Failures become trace files; the run goes on unless `fail_fast`."""

from __future__ import annotations

import contextlib
import io
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
from harness.fuzz.database import open_database
from harness.fuzz.options import FuzzOptions
from harness.fuzz.progress import Progress, Stats
from harness.profiles import register_profiles
from harness.trace import classify
from strategies import SCENARIOS

ROUND_EXAMPLES = 5  # small rounds: the budget is checked between rounds
# Hypothesis finds the failing example; delta debugging shrinks its trace (Hypothesis' own
# shrinker takes minutes on these programs, ddmin seconds)
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def record_failure(stats: Stats, config_name: str, check: str, message: str, path: Optional[str], out: TextIO) -> None:
    message = message.removeprefix(f"[{check}] ")
    stats.failures.append({"config": config_name, "check": check, "message": message, "trace": path,
                           "replay": f"python -m harness replay {path}" if path else None})
    out.write(f"\nfuzz: FAILURE in {config_name}: [{check}] {message.splitlines()[0]}\n")
    if path:
        out.write(f"fuzz: trace {path}\nfuzz: replay with: python -m harness replay {path}\n")


def hypothesis_round(options: FuzzOptions, factory, machine, scenario_name: str, round_no: int, stats: Stats, database,
                     out: TextIO) -> bool:
    """Five state-machine examples of one configuration's machine; False if one failed."""
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
        check, path = classify(exc), noted_trace_path(exc)
        if path is not None:
            path = shrink_saved(path, factory, check, options.trace_dir)
        record_failure(stats, scenario_name, check, str(exc), path, out)
        return False
    return True


def random_round(options: FuzzOptions, factory, scenario_name: str, rng: random.Random, steps: int, stats: Stats,
                 set_aside, out: TextIO) -> bool:
    """One random program of one configuration; False if it failed."""
    try:
        random_program(SCENARIOS[scenario_name], factory, rng, steps, options.device, options.trace_dir, stats.record,
                       options.protocol, set_aside)
    except ProgramFailed as failed:
        record_failure(stats, scenario_name, failed.check, failed.message, failed.path, out)
        return False
    return True


def peak_rss_mib() -> float:
    """The process's peak resident memory so far, in MiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_single(options: FuzzOptions, out: TextIO, worker: int = 0, shared=None, stop=None) -> Dict[str, Any]:
    """One fuzz process: rotate through the configurations until the budget ends, or until
    `stop` (an event, see `harness.fuzz.stop`) is set."""
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
    database = open_database(options.db) if options.engine == "hypothesis" else None
    rng = random.Random(None if options.seed is None else options.seed * 7919 + worker)
    set_aside = options.known_findings()
    # one machine class per configuration for the whole run: Hypothesis keeps what it learns of a
    # machine class (its rules) for as long as the process lives, so a class a round would grow it
    machines = {
        name: machine_for(SCENARIOS[name], factory, options.device, stats.record, trace_dir=options.trace_dir,
                          protocol=options.protocol, set_aside=set_aside)
        for name in options.configs
    } if options.engine == "hypothesis" else {}
    steps = settings.get_profile(options.profile).stateful_step_count
    round_no = worker
    started = time.monotonic()
    rss_after_first_round = None
    # a configuration that failed leaves the rotation: its next rounds would only find the same
    # failure again (the example database replays it first)
    configs = list(options.configs)
    while configs and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        name = configs[round_no % len(configs)]
        if options.engine == "hypothesis":
            ok = hypothesis_round(options, factory, machines[name], name, round_no, stats, database, out)
        else:
            ok = random_round(options, factory, name, rng, steps, stats, set_aside, out)
        round_no += 1
        if rss_after_first_round is None:
            rss_after_first_round = peak_rss_mib()
        tick()
        if not ok:
            if options.fail_fast:
                break
            configs.remove(name)
    elapsed = time.monotonic() - started
    if progress is not None:
        progress.show(stats.programs, stats.steps, len(stats.failures), final=True)
    return {
        "programs": stats.programs,
        "steps": stats.steps,
        "elapsed_seconds": elapsed,
        "failures": stats.failures,
        "first_failure_programs": stats.first_failure_programs,
        "first_failure_seconds": stats.first_failure_seconds,
        "reach": dict(stats.labels),
        "peak_rss_mib": peak_rss_mib(),
        "peak_rss_after_first_round_mib": rss_after_first_round,
    }
