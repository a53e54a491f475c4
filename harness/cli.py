"""`python -m harness`: the command line.

  fuzz [--minutes M | --seconds S] [--device] [--impl] [--profile] [--config NAME ...] [--seed N]
       [--db DIR|redis://host:port/n] [--report FILE] [--engine hypothesis|random] [--workers N]
       [--fail-fast]
  replay FILE [--impl impl|sglang|MODULE:CLASS] [--device cpu|cuda] [--verbose] [--to-pytest]
  mutants [--profile ci] [--engine hypothesis|random] [--only NAME ...] [--workers N] [--device]
          [--seed N] [--json FILE]

Exit status: 0 when the fuzz found nothing / the trace replays with every check passing, 1 when
something failed (the report says where and why), 2 when the command or a file is unusable.
With no arguments, `python -m harness` runs a one-minute fuzz (the main job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, TextIO

from harness.adapters import adapter_for
from harness.driver import Divergence
from harness.invariants import InvariantViolation
from harness.trace import Trace, TraceError, Verdict, load_trace, replay


class UsageError(Exception):
    """A command-line argument that cannot be used; the message says which and why."""


def _call(entry) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in entry["args"].items())
    return f"{entry['op']}({args})"


def explain(verdict: Verdict) -> str:
    """The failure in plain words: what the model expected, what the implementation did."""
    failure, exc = verdict.failure, verdict.error
    where = "before the first operation" if failure.step < 0 else f"at step {failure.step}"
    if isinstance(exc, Divergence):
        return (
            f"FAILED {where}: the implementation and the model disagree.\n"
            f"  {exc}\n"
            f"  (the model is the specification: the implementation's answer is the wrong one)"
        )
    if isinstance(exc, InvariantViolation):
        return f"FAILED {where}: invariant '{exc.check}' broke.\n  {exc.message}"
    return (
        f"FAILED {where}: the implementation raised {type(exc).__name__} where the model "
        f"expected the operation to succeed.\n  {exc}"
    )


def to_pytest(trace: Trace, name: str) -> str:
    """The trace as a standalone pytest function."""
    lines = [
        "from harness.config import CacheConfig",
        "from harness.driver import PairedScheduler",
        "",
        "",
        f"def test_{name}():",
        f"    driver = PairedScheduler(CacheConfig(**{json.dumps(trace.config.__dict__)}))",
        "    driver.check()",
    ]
    for entry in trace.operations:
        lines.append(f"    driver.{_call(entry)}")
        lines.append("    driver.check()")
    return "\n".join(lines) + "\n"


def run_replay(args, out: TextIO) -> int:
    trace = load_trace(args.file)
    try:
        adapter = adapter_for(args.impl)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.to_pytest:
        stem = "".join(c if c.isalnum() else "_" for c in args.file.rsplit("/", 1)[-1].removesuffix(".json"))
        out.write(to_pytest(trace, f"replay_{stem}"))
        return 0

    def show(step: int, entry, driver) -> None:
        out.write(f"step {step}: {_call(entry)}\n")
        if args.verbose:
            for line in driver.adapter.format_tree().splitlines():
                out.write(f"    {line}\n")

    out.write(f"replaying {args.file}: {len(trace.operations)} operations against {args.impl} on {args.device or trace.config.device}\n")
    verdict = replay(trace, adapter, device=args.device, on_step=show, source=args.file)
    if verdict.ok:
        out.write(f"OK: all {verdict.steps_run} operations replayed, every invariant held\n")
        return 0
    failing = trace.operations[verdict.failure.step] if verdict.failure.step >= 0 else None
    if failing is not None:
        out.write(f"step {verdict.failure.step}: {_call(failing)}\n")
    out.write(explain(verdict) + "\n")
    return 1


def run_fuzz(args, out: TextIO) -> int:
    from harness.fuzz import FuzzOptions, fuzz
    from strategies import SCENARIOS

    seconds = args.seconds if args.seconds is not None else 60.0 * (args.minutes if args.minutes is not None else 1.0)
    options = FuzzOptions(
        seconds=seconds,
        impl=args.impl,
        profile=args.profile,
        configs=args.config or sorted(SCENARIOS),
        seed=args.seed,
        db=args.db,
        report=args.report,
        engine=args.engine,
        workers=args.workers if args.workers is not None else (os.cpu_count() or 1),
        fail_fast=args.fail_fast,
    )
    if args.device:
        options.device = args.device
    if args.trace_dir:
        options.trace_dir = args.trace_dir
    try:
        report = fuzz(options, out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 1 if report["failures"] else 0


def run_mutants(args, out: TextIO) -> int:
    from bench.mutants import BY_NAME, MUTANTS
    from bench.mutants.hunt import report
    from harness.config import best_device, check_device
    from harness.profiles import PROFILES

    device = args.device or best_device()
    try:
        check_device(device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.profile not in PROFILES:
        raise UsageError(f"--profile must be one of {list(PROFILES)}, got {args.profile!r}")
    unknown = [name for name in args.only or () if name not in BY_NAME]
    if unknown:
        raise UsageError(f"--only: unknown mutant(s) {unknown}; known: {sorted(BY_NAME)}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    names = args.only or [m.name for m in MUTANTS]
    workers = args.workers or os.cpu_count() or 1
    return report(names, args.engine, args.profile, device, workers, args.seed, args.json, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Hybrid radix cache harness")
    sub = parser.add_subparsers(dest="command")
    fz = sub.add_parser("fuzz", help="fuzz a cache against the model for a time budget (the main job)")
    budget = fz.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, help="time budget in minutes (default 1)")
    budget.add_argument("--seconds", type=float, help="time budget in seconds")
    fz.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    fz.add_argument("--impl", default="impl", help="impl (default), sglang (SGLang's own cache, when installed) or MODULE:CLASS, a subclass of impl's MambaRadixCache")
    fz.add_argument("--profile", default="nightly", help="Hypothesis profile for program length (dev, ci, nightly, mutation)")
    fz.add_argument("--config", action="append", help="configuration to fuzz (repeatable; default: rotate through all)")
    fz.add_argument("--seed", type=int, default=None, help="seed for reproducible runs")
    fz.add_argument("--db", default=None, help="example database: a directory (default .hypothesis/fuzz) or redis://host:port/n")
    fz.add_argument("--report", default=None, help="write a JSON report here")
    fz.add_argument("--engine", default="hypothesis", help="hypothesis (default) or random")
    fz.add_argument("--workers", type=int, default=None, help="processes sharing the database (default: one per core)")
    fz.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    fz.add_argument("--trace-dir", default=None, help="where failure traces go (default tests/regressions/pending)")
    fz.set_defaults(run=run_fuzz)
    rp = sub.add_parser("replay", help="replay a trace file with every invariant checked")
    rp.add_argument("file")
    rp.add_argument("--impl", default="impl", help="impl (default), sglang (SGLang's own cache, when installed) or MODULE:CLASS, a subclass of impl's MambaRadixCache")
    rp.add_argument("--device", default=None, help="torch device (default: the trace's)")
    rp.add_argument("--verbose", action="store_true", help="print the tree after every operation")
    rp.add_argument("--to-pytest", action="store_true", help="print the trace as a standalone pytest function")
    rp.set_defaults(run=run_replay)
    mu = sub.add_parser("mutants", help="run the harness against every seeded bug in bench/mutants and print the table")
    mu.add_argument("--profile", default="ci", help="Hypothesis profile: each configuration's budget (default ci)")
    mu.add_argument("--engine", default="hypothesis", choices=("hypothesis", "random"))
    mu.add_argument("--only", action="append", metavar="NAME", help="hunt only this mutant (repeatable)")
    mu.add_argument("--workers", type=int, default=None, help="mutants hunted at once, each in its own process (default one per core)")
    mu.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    mu.add_argument("--seed", type=int, default=0, help="seed of the random engine's programs")
    mu.add_argument("--json", default=None, help="also write the results to this file")
    mu.set_defaults(run=run_mutants)
    return parser


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv or ["fuzz"])
    try:
        return args.run(args, out)
    except (TraceError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
