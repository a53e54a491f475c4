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
from dataclasses import asdict, dataclass, replace
from typing import FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

import impl

from bench import markdown_table, write_json
from bench.mutants.catalogue import BY_NAME
from bench.mutants.patch import applied
from harness.findings import SetAside, set_aside
from strategies.config import Serving
from strategies.scenarios import Scenario

# Cheap, eviction-heavy configurations first: most bugs show there within a few programs.
HUNT_ORDER = ("tiny", "medium", "chunked", "lock_heavy", "decode_pressure", "extra_keys", "disagg_prefill", "large")


class HuntUnavailable(RuntimeError):
    """A mutant whose path cannot be hunted on this machine (SGLang's scheduler missing)."""


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
    not_hunted: Optional[str] = None  # why it could not be hunted here (its path needs SGLang)


class Path(NamedTuple):
    """Where a mutant is hunted: under impl's own hand-written protocol, or inside the installed
    SGLang's own scheduler with the server settings of the path it breaks pinned (that
    scheduler's known findings set aside)."""

    serving: Optional[Serving] = None

    @property
    def protocol(self) -> Optional[str]:
        return None if self.serving is None else "scheduler"

    def configs(self) -> Tuple[str, ...]:
        """The configurations tried, in order (the scheduler runs no disaggregation)."""
        return HUNT_ORDER if self.serving is None else tuple(c for c in HUNT_ORDER if c != "disagg_prefill")

    def scenario(self, config: str) -> Scenario:
        from strategies import SCENARIOS

        scenario = SCENARIOS[config]
        return scenario if self.serving is None else replace(scenario, servings=(self.serving,))

    def set_aside(self) -> SetAside:
        if self.serving is None:
            return SetAside()
        from harness.caches.sglang_loader import sglang_version

        return set_aside(["all"], impl.__version__, sglang_version())

    def unavailable(self) -> str:
        """Why this path cannot be hunted on this machine ("" when it can)."""
        if self.serving is None:
            return ""
        from harness.caches import ImplCache
        from harness.protocols.scheduler import RealSchedulerProtocol

        return RealSchedulerProtocol.refusal(ImplCache)


def _hypothesis_attempt(config: str, profile: str, device: str, stats, trace_dir: str, checks, path: Path = Path()):
    """Hypothesis finds the failing program; delta debugging shrinks its trace."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from harness.caches import ImplCache
    from harness.engines.hypothesis_engine import machine_for, noted_trace_path
    from harness.engines.shrink import shrink_saved
    from harness.fuzz.rounds import NO_SHRINK
    from harness.signature import check_of

    machine = machine_for(path.scenario(config), ImplCache, device, stats.record, trace_dir=trace_dir,
                          protocol=path.protocol, set_aside=path.set_aside(), checks=checks)
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


def _random_attempt(config: str, profile: str, device: str, stats, trace_dir: str, seed: int, checks, path: Path = Path()):
    from hypothesis import settings

    from harness.caches import ImplCache
    from harness.engines.random_engine import ProgramFailed, random_program

    budget = settings.get_profile(profile)
    rng = random.Random(seed)
    for _ in range(budget.max_examples):
        try:
            random_program(path.scenario(config), ImplCache, rng, budget.stateful_step_count, device, trace_dir, stats.record,
                           protocol=path.protocol, set_aside=path.set_aside(), checks=checks)
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
    path = Path(mutant.serving)
    unavailable = path.unavailable()
    if unavailable:
        raise HuntUnavailable(f"mutant {name} breaks a path hunted inside SGLang's own scheduler: {unavailable}")
    stats = Stats()
    outcome, config = None, None
    with tempfile.TemporaryDirectory() as trace_dir, applied(mutant):
        for config in path.configs():
            if engine == "hypothesis":
                outcome = _hypothesis_attempt(config, profile, device, stats, trace_dir, checks, path)
            else:
                outcome = _random_attempt(config, profile, device, stats, trace_dir, seed, checks, path)
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
    try:
        return hunt(*job)
    except HuntUnavailable as why:
        mutant = BY_NAME[job[0]]
        return HuntResult(mutant=mutant.name, area=mutant.area, caught=False, check=None, config=None, seconds_to_failure=None,
                          trace_operations=None, programs=0, seconds=0.0, not_hunted=str(why))


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
        ((f"`{r.mutant}`", r.area, "not hunted (needs SGLang)" if r.not_hunted else "yes" if r.caught else "**NO**",
          r.check, r.config, r.seconds_to_failure, r.trace_operations) for r in results),
    )


def report(names: Sequence[str], engine: str, profile: str, device: str, workers: int, seed: int,
           json_path: Optional[str], out) -> int:
    """Hunt, print the table and a summary line (and write `json_path`); 0 if all were caught."""
    started = time.monotonic()
    results = run(names, engine, profile, device, workers, seed)
    elapsed = time.monotonic() - started
    caught = sum(r.caught for r in results)
    hunted = [r for r in results if not r.not_hunted]
    out.write(table(results) + "\n\n")
    out.write(f"{caught}/{len(hunted)} seeded bugs caught ({engine} engine, {profile} profile, {device}) in {elapsed:.0f} s\n")
    for r in results:
        if r.not_hunted:
            out.write(f"not hunted: {r.not_hunted}\n")
    if json_path:
        write_json(json_path, {"engine": engine, "profile": profile, "device": device, "seconds": round(elapsed, 1),
                               "results": [asdict(r) for r in results]})
    return 0 if caught == len(hunted) else 1
