"""`python -m harness fuzz`: a time-budgeted fuzz of a cache against the model.

Two engines share the operation chooser (`harness.program`) and every invariant:
  hypothesis  the state machine, in rounds of examples, with an example database (a directory,
              or `redis://host:port/n` for Hypothesis' Redis database shared between runners);
  random      seeded random programs without Hypothesis' per-step overhead; a failing program is
              shrunk by delta debugging over its operations.
Failures become trace files (`harness.trace`); the run goes on with the other configurations
until the budget ends unless `fail_fast`. `--workers N` runs N processes sharing the database.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import platform
import queue
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, TextIO

import hypothesis
import torch
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from harness.adapters import adapter_for
from harness.config import best_device, check_device
from harness.driver import PairedScheduler
from harness.machine import PENDING_DIR, machine_for
from harness.profiles import PROFILES, PROJECT_ROOT, register_profiles
from harness.program import OperationChooser
from harness.trace import Trace, TraceError, classify, failure_trace, replay, save_trace
from strategies import SCENARIOS
from strategies.draws import RandomDraws

ROUND_EXAMPLES = 5  # small rounds: the budget is checked between rounds
PROGRESS_SECONDS_TTY = 0.5
PROGRESS_SECONDS_LOG = 10.0


@dataclass
class FuzzOptions:
    seconds: float = 60.0
    device: str = field(default_factory=best_device)
    impl: str = "impl"
    profile: str = "nightly"
    configs: List[str] = field(default_factory=lambda: sorted(SCENARIOS))
    seed: Optional[int] = None
    db: Optional[str] = None  # directory (default .hypothesis/fuzz) or redis://host:port/n
    report: Optional[str] = None
    engine: str = "hypothesis"
    workers: int = 1
    fail_fast: bool = False
    trace_dir: str = field(default_factory=lambda: os.environ.get("HARNESS_TRACE_DIR") or PENDING_DIR)

    def check(self) -> None:
        unknown = [c for c in self.configs if c not in SCENARIOS]
        if unknown:
            raise ValueError(f"--config: unknown configuration(s) {unknown}; known: {sorted(SCENARIOS)}")
        if self.engine not in ("hypothesis", "random"):
            raise ValueError(f"--engine must be hypothesis or random, got {self.engine!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"--profile must be one of {list(PROFILES)}, got {self.profile!r}")
        if self.seconds <= 0:
            raise ValueError(f"the budget must be positive, got {self.seconds} seconds")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.db and self.db.startswith("redis://"):
            try:
                importlib.import_module("redis")
            except ImportError:
                raise ValueError("--db redis://...: the redis package is not installed (pip install redis)") from None
        adapter_for(self.impl)
        check_device(self.device)


def open_database(spec: Optional[str]):
    """The example database named by `spec`: a directory, or `redis://host:port/n`."""
    if spec and spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec or os.path.join(PROJECT_ROOT, ".hypothesis", "fuzz"))


class Stats:
    """Counters of one fuzz process; `record` is the machine's event sink."""

    def __init__(self):
        self.labels: Counter = Counter()
        self.programs = 0
        self.steps = 0
        self.failures: List[Dict[str, Any]] = []
        self.first_failure_programs: Optional[int] = None
        self.started = time.monotonic()
        self.first_failure_seconds: Optional[float] = None  # from `started` to the first failing program
        self.on_tick: Callable[[], None] = lambda: None

    def record(self, label: str) -> None:
        if label == "program":
            self.programs += 1
        elif label == "program failed":
            if self.first_failure_programs is None:
                self.first_failure_programs = self.programs
                self.first_failure_seconds = time.monotonic() - self.started
        elif label.startswith("operation: "):
            self.steps += 1
            if self.steps % 32 == 0:
                self.on_tick()
        else:
            self.labels[label] += 1


class Progress:
    """A progress bar on a terminal, plain periodic lines otherwise (CI logs)."""

    def __init__(self, budget: float, out: TextIO):
        self.budget = budget
        self.out = out
        self.tty = out.isatty()
        self.start = time.monotonic()
        self.last = 0.0

    def show(self, programs: int, steps: int, failures: int, final: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.start
        if not final and now - self.last < (PROGRESS_SECONDS_TTY if self.tty else PROGRESS_SECONDS_LOG):
            return
        self.last = now
        rate = steps / elapsed if elapsed > 0 else 0.0
        figures = f"{elapsed:5.0f}s/{self.budget:.0f}s programs {programs} steps {steps} ({rate:.0f}/s) failures {failures}"
        if self.tty:
            done = min(1.0, elapsed / self.budget)
            bar = "#" * int(done * 24) + "." * (24 - int(done * 24))
            self.out.write(f"\r[{bar}] {figures}" + ("\n" if final else ""))
        else:
            self.out.write(f"fuzz: {figures}\n")
        self.out.flush()


def shrink_operations(trace: Trace, adapter_factory, check: str) -> Trace:
    """Delta debugging (ddmin over complements) of a failing trace's operations, keeping only
    reductions that still fail with the same check."""

    def fails(ops: List[Dict[str, Any]]) -> bool:
        try:
            verdict = replay(replace(trace, operations=ops), adapter_factory)
        except TraceError:
            return False
        return not verdict.ok and verdict.failure.check == check

    ops = list(trace.operations)
    chunks = 2
    while len(ops) >= 2:
        size = -(-len(ops) // chunks)
        for start in range(0, len(ops), size):
            complement = ops[:start] + ops[start + size :]
            if complement and fails(complement):
                ops = complement
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(ops):
                break
            chunks = min(len(ops), chunks * 2)
    verdict = replay(replace(trace, operations=ops), adapter_factory)
    return replace(trace, operations=ops, failure=verdict.failure)


def noted_trace_path(exc: BaseException) -> Optional[str]:
    """The trace file a state-machine failure's notes name (written on its final, shrunk run)."""
    for note in getattr(exc, "__notes__", []):
        match = re.search(r"Trace written to (\S+)", note)
        if match:
            return match.group(1)
    return None


def _record_failure(stats: Stats, config_name: str, check: str, message: str, path: Optional[str], out: TextIO) -> None:
    stats.failures.append({"config": config_name, "check": check, "message": message, "trace": path,
                           "replay": f"python -m harness replay {path}" if path else None})
    out.write(f"\nfuzz: FAILURE in {config_name}: [{check}] {message.splitlines()[0]}\n")
    if path:
        out.write(f"fuzz: trace {path}\nfuzz: replay with: python -m harness replay {path}\n")


def _hypothesis_round(options: FuzzOptions, adapter_factory, scenario_name: str, round_no: int, stats: Stats, database, out: TextIO) -> bool:
    machine = machine_for(SCENARIOS[scenario_name], adapter_factory, options.device, stats.record, trace_dir=options.trace_dir)
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
    )
    try:
        run_state_machine_as_test(machine, settings=budget)
    except Exception as exc:
        _record_failure(stats, scenario_name, classify(exc), str(exc), noted_trace_path(exc), out)
        return False
    return True


def random_program(options: FuzzOptions, adapter_factory, scenario_name: str, rng: random.Random, steps: int, stats: Stats, out: TextIO) -> bool:
    """One seeded random program of `steps` operations, every invariant checked after each.

    Returns False on a failure, which is shrunk, saved as a trace and recorded in `stats`.
    """
    scenario = SCENARIOS[scenario_name]
    draws = RandomDraws(random.Random(rng.getrandbits(64)))
    config = draws.config(scenario, options.device)
    stats.record("program")
    driver = PairedScheduler(config, adapter_factory, on_event=stats.record)
    chooser = OperationChooser(scenario)
    try:
        driver.check()
        for _ in range(steps):
            op, args = chooser.next(driver, draws)
            stats.record(f"operation: {op}")
            driver.apply(op, **args)
            driver.check()
    except Exception as exc:
        stats.record("program failed")
        check = classify(exc)
        shrunk = shrink_operations(failure_trace(driver, exc, scenario_name), adapter_factory, check)
        path = save_trace(shrunk, options.trace_dir)
        _record_failure(stats, scenario_name, check, str(exc), path, out)
        return False
    return True


def run_single(options: FuzzOptions, out: TextIO, worker: int = 0, shared=None) -> Dict[str, Any]:
    """One fuzz process: rotate through the configurations until the budget ends."""
    register_profiles()
    adapter_factory = adapter_for(options.impl)
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
    steps = settings.get_profile(options.profile).stateful_step_count
    round_no = worker
    started = time.monotonic()
    while time.monotonic() < deadline:
        name = options.configs[round_no % len(options.configs)]
        if options.engine == "hypothesis":
            ok = _hypothesis_round(options, adapter_factory, name, round_no, stats, database, out)
        else:
            ok = random_program(options, adapter_factory, name, rng, steps, stats, out)
        round_no += 1
        tick()
        if not ok and options.fail_fast:
            break
    elapsed = time.monotonic() - started
    if progress is not None:
        progress.show(stats.programs, stats.steps, len(stats.failures), final=True)
    return {
        "programs": stats.programs,
        "steps": stats.steps,
        "elapsed_seconds": elapsed,
        "failures": stats.failures,
        "first_failure_programs": stats.first_failure_programs,
        "reach": dict(stats.labels),
    }


def _worker_main(options: FuzzOptions, worker: int, shared, results) -> None:
    results.put((worker, run_single(options, sys.stdout, worker, shared)))


def run_workers(options: FuzzOptions, out: TextIO) -> List[Dict[str, Any]]:
    """`options.workers` processes sharing the database; progress from their counters."""
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    shared = manager.dict({i: (0, 0, 0) for i in range(options.workers)})
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(options, i, shared, results)) for i in range(options.workers)]
    for p in procs:
        p.start()
    progress = Progress(options.seconds, out)
    collected: Dict[int, Dict[str, Any]] = {}
    while len(collected) < len(procs):
        try:
            worker, report = results.get(timeout=0.5)
            collected[worker] = report
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
        totals = [sum(v[k] for v in shared.values()) for k in range(3)]
        progress.show(*totals)
    for p in procs:
        p.join()
    missing = [i for i in range(options.workers) if i not in collected]
    if missing:
        raise RuntimeError(f"fuzz worker(s) {missing} died without a report")
    totals = [sum(r[k] for r in collected.values()) for k in ("programs", "steps")]
    progress.show(totals[0], totals[1], sum(len(r["failures"]) for r in collected.values()), final=True)
    return [collected[i] for i in sorted(collected)]


def _sglang_version() -> str:
    from harness.sglang_adapter import sglang_version

    return sglang_version()


def fuzz(options: FuzzOptions, out: TextIO = sys.stdout) -> Dict[str, Any]:
    """Run the fuzz; returns the report (also written to `options.report` when given)."""
    options.check()
    out.write(
        f"fuzz: {options.engine} engine, {options.impl} against the model on {options.device}, "
        f"{options.seconds:.0f}s, {options.workers} worker(s), configurations {options.configs}\n"
    )
    reports = run_workers(options, out) if options.workers > 1 else [run_single(options, out)]
    elapsed = max(r["elapsed_seconds"] for r in reports)
    steps = sum(r["steps"] for r in reports)
    reach: Counter = Counter()
    for r in reports:
        reach.update(r["reach"])
    firsts = [r["first_failure_programs"] for r in reports if r["first_failure_programs"] is not None]
    report = {
        "engine": options.engine,
        "impl": options.impl,
        "budget_seconds": options.seconds,
        "elapsed_seconds": round(elapsed, 3),
        "workers": options.workers,
        "configs": options.configs,
        "seed": options.seed,
        "database": options.db if options.engine == "hypothesis" else None,
        "programs": sum(r["programs"] for r in reports),
        "steps": steps,
        "steps_per_second": round(steps / elapsed, 1) if elapsed > 0 else 0.0,
        "failures": [f for r in reports for f in r["failures"]],
        "first_failure_programs": min(firsts) if firsts else None,
        "reach": dict(sorted(reach.items())),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "hypothesis": hypothesis.__version__,
            "impl": __import__("impl").__version__,
            **({"sglang": _sglang_version()} if options.impl == "sglang" else {}),
        },
        "device": torch.cuda.get_device_name(0) if torch.device(options.device).type == "cuda" else "cpu",
    }
    if options.report:
        with open(options.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, sort_keys=True)
            f.write("\n")
    out.write(
        f"fuzz: {report['programs']} programs, {steps} steps ({report['steps_per_second']}/s), "
        f"{len(report['failures'])} failure(s)\n"
    )
    return report


__all__ = ["FuzzOptions", "Stats", "fuzz", "noted_trace_path", "shrink_operations"]
