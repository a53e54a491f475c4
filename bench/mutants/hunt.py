"""Hunting seeded bugs: run the harness against each one and print the table (`python -m bench.mutants`).

Each mutant is hunted in a fresh process (the patch never leaks into another run): the
configurations are tried in turn, each with the profile's full budget (examples x steps), until
one fails. The table says whether it was caught, by which check and configuration, the seconds
to the first failing program (before shrinking) and the length of the shrunk trace. Exit status
0 when every mutant was caught, 1 when any survived, 2 for unusable arguments.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import FrozenSet, List, Optional, Sequence

from bench import markdown_table, write_json
from bench.mutants.catalogue import BY_NAME
from bench.mutants.patch import applied

# Cheap, eviction-heavy configurations first: most bugs show there within a few programs.
HUNT_ORDER = ("tiny", "medium", "chunked", "lock_heavy", "decode_pressure", "extra_keys", "disagg_prefill", "large")


@dataclass
class HuntResult:
    """One mutant's row of the table."""

    mutant: str
    area: str
    caught: bool
    check: Optional[str]
    config: Optional[str]
    seconds_to_failure: Optional[float]  # from the start of the hunt to the first failing program
    trace_operations: Optional[int]  # operations in the shrunk trace
    programs: int  # programs run before (and including) the first failing one, or in all
    seconds: float  # the whole hunt, shrinking included


def _hypothesis_attempt(config: str, profile: str, device: str, stats, trace_dir: str, checks):
    """Hypothesis finds the failing program; delta debugging shrinks its trace."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from harness.caches import ImplCache
    from harness.engines.hypothesis_engine import machine_for, noted_trace_path
    from harness.engines.shrink import shrink_saved
    from harness.fuzz.rounds import NO_SHRINK
    from harness.signature import check_of
    from strategies import SCENARIOS

    machine = machine_for(SCENARIOS[config], ImplCache, device, stats.record, trace_dir=trace_dir, checks=checks)
    budget = settings(
        settings.get_profile(profile), database=None, deadline=None, report_multiple_bugs=False,
        print_blob=False, phases=NO_SHRINK,
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            run_state_machine_as_test(machine, settings=budget)
    except Exception as exc:
        check = check_of(exc)
        return check, shrink_saved(noted_trace_path(exc), ImplCache, trace_dir)
    return None


def _random_attempt(config: str, profile: str, device: str, stats, trace_dir: str, seed: int, checks):
    from hypothesis import settings

    from harness.caches import ImplCache
    from harness.engines.random_engine import ProgramFailed, random_program
    from strategies import SCENARIOS

    budget = settings.get_profile(profile)
    rng = random.Random(seed)
    for _ in range(budget.max_examples):
        try:
            random_program(SCENARIOS[config], ImplCache, rng, budget.stateful_step_count, device, trace_dir, stats.record,
                           checks=checks)
        except ProgramFailed as failed:
            return failed.check, failed.path
    return None


def hunt(name: str, engine: str = "hypothesis", profile: str = "ci", device: str = "cpu", seed: int = 0,
         checks: Optional[FrozenSet[str]] = None) -> HuntResult:
    """Apply mutant `name` and run the harness on it until it fails or every configuration's
    budget is spent; `checks` runs only those checks (default every one)."""
    from harness.driver import CHECKS
    from harness.fuzz.progress import Stats
    from harness.profiles import register_profiles
    from harness.trace import load_trace

    register_profiles()
    checks = CHECKS if checks is None else checks
    mutant = BY_NAME[name]
    stats = Stats()
    outcome, config = None, None
    with tempfile.TemporaryDirectory() as trace_dir, applied(mutant):
        for config in HUNT_ORDER:
            if engine == "hypothesis":
                outcome = _hypothesis_attempt(config, profile, device, stats, trace_dir, checks)
            else:
                outcome = _random_attempt(config, profile, device, stats, trace_dir, seed, checks)
            if outcome is not None:
                break
        seconds = time.monotonic() - stats.started
        check, path = outcome if outcome is not None else (None, None)
        length = len(load_trace(path).operations) if path else None
    return HuntResult(
        mutant=name,
        area=mutant.area,
        caught=outcome is not None,
        check=check,
        config=config if outcome is not None else None,
        seconds_to_failure=None if stats.first_failure_seconds is None else round(stats.first_failure_seconds, 2),
        trace_operations=length,
        programs=stats.first_failure_programs if outcome is not None else stats.programs,
        seconds=round(seconds, 2),
    )


def _hunt_star(job) -> HuntResult:
    return hunt(*job)


def run(names: Sequence[str], engine: str, profile: str, device: str, workers: int, seed: int = 0) -> List[HuntResult]:
    """Hunt every named mutant, `workers` at a time, each in a fresh process; results in order."""
    jobs = [(name, engine, profile, device, seed) for name in names]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1) as pool:
        return list(pool.map(_hunt_star, jobs))


def table(results: Sequence[HuntResult]) -> str:
    """The results as a Markdown table."""
    return markdown_table(
        ("mutant", "area", "caught", "check", "config", "first failure (s)", "shrunk trace (ops)"), "lllllrr",
        ((f"`{r.mutant}`", r.area, "yes" if r.caught else "**NO**", r.check, r.config, r.seconds_to_failure,
          r.trace_operations) for r in results),
    )


def report(names: Sequence[str], engine: str, profile: str, device: str, workers: int, seed: int,
           json_path: Optional[str], out) -> int:
    """Hunt, print the table and a summary line (and write `json_path`); 0 if all were caught."""
    started = time.monotonic()
    results = run(names, engine, profile, device, workers, seed)
    elapsed = time.monotonic() - started
    caught = sum(r.caught for r in results)
    out.write(table(results) + "\n\n")
    out.write(f"{caught}/{len(results)} seeded bugs caught ({engine} engine, {profile} profile, {device}) in {elapsed:.0f} s\n")
    if json_path:
        write_json(json_path, {"engine": engine, "profile": profile, "device": device, "seconds": round(elapsed, 1),
                               "results": [asdict(r) for r in results]})
    return 0 if caught == len(results) else 1
