"""`python -m harness`: the command line.

  fuzz [--minutes M | --seconds S] [--device] [--impl] [--tree-core] [--protocol] [--profile]
       [--config NAME ...] [--seed N] [--db DIR|redis://host:port/n] [--report FILE]
       [--engine hypothesis|random] [--workers N] [--fail-fast] [--fail-on-known] [--trace-dir DIR]
       [--set-aside FINDING|all|TRACE.json|SIGNATURE ...]
  replay FILE [--impl impl|sglang|sglang-CORE|MODULE:CLASS] [--tree-core python|rust|parity]
       [--protocol NAME] [--device cpu|cuda] [--verbose] [--to-pytest | --to-script]
       (default: on the cache, release, protocol and settings the trace was recorded on)
  releases TRACE [--from V] [--to V] [--json] [--jobs N]    (or --fuzz SECONDS instead of TRACE)

Exit status: 0 when the fuzz found nothing / the trace replays with every check passing, 1 when
something failed (the report says where and why), 2 when the command or a file is unusable (one
line on stderr, before any work), 130 / 143 when SIGINT / SIGTERM stopped a fuzz (its summary and
report are written, marked `interrupted`).
With no arguments, `python -m harness` runs `fuzz` with its defaults (the main job), as --help says.
The seeded-bug hunt is `python -m bench.mutants`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
import math
import os
import sys
from typing import List, Optional, TextIO

from harness.caches import TREE_CORES, cache_factory, impl_name
from harness.checks import InvariantViolation
from harness.devices import check_device
from harness.fuzz.stop import EXIT_STATUS
from harness.pairing import Divergence, ReleaseRaised
from harness.profiles import PROFILES
from harness.protocols import PROTOCOLS, protocol_class
from harness.trace import Trace, TraceError, Verdict, load_trace, replay, replay_protocol
from harness.usage import CommandParser
from strategies import SCENARIOS
from strategies.config import EVENT_LOOPS, MAMBA_STRATEGIES, PAGE_SIZES, SERVER_SETTINGS, setting_flags


class UsageError(Exception):
    """A command-line argument that cannot be used; the message says which and why."""


def _call(entry) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in entry["args"].items())
    return f"{entry['op']}({args})"


def explain(verdict: Verdict) -> str:
    """The failure in plain words: what the model expected, what the cache did."""
    failure, exc = verdict.failure, verdict.error
    where = "before the first operation" if failure.step < 0 else f"at step {failure.step}"
    if isinstance(exc, Divergence):
        return (
            f"FAILED {where}: the cache and the model disagree.\n"
            f"  {exc}\n"
            f"  (the model is the specification: the cache's answer is the wrong one)"
        )
    if isinstance(exc, InvariantViolation):
        return f"FAILED {where}: check '{exc.check}' broke.\n  {exc.message}"
    if isinstance(exc, ReleaseRaised):
        return f"FAILED {where}: the release's scheduler raised (in serving, its process dies).\n  {exc}"
    return f"FAILED {where}: the cache raised {type(exc).__name__} inside a call its scheduler makes.\n  {exc}"


def to_pytest(trace: Trace, name: str, protocol: str) -> str:
    """The trace as a standalone pytest function."""
    lines = [
        "from harness.driver import Driver, paused_gc",
        "from strategies.config import CacheConfig, SchedulerConfig",
        "",
        "",
        f"def test_{name}():",
        "    with paused_gc():",
        f"        driver = Driver(CacheConfig(**{json.dumps(trace.config.__dict__)}), "
        f"SchedulerConfig(**{json.dumps(trace.scheduler.__dict__)}), protocol={protocol!r})",
        "        driver.check()",
    ]
    for entry in trace.operations:
        lines.append(f"        driver.apply({entry['op']!r}, **{entry['args']!r})")
        lines.append("        driver.check()")
    return "\n".join(lines) + "\n"


def replay_device(requested: Optional[str], recorded: str) -> str:
    """The device a replay runs on: the one asked for (checked), else the trace's; a trace
    recorded on a device this machine lacks replays on `cpu`, with a note on stderr."""
    if requested is not None:
        check_device(requested)
        return requested
    try:
        check_device(recorded)
    except ValueError:
        print(f"note: the trace was recorded on {recorded}, which this machine lacks; replaying on cpu", file=sys.stderr)
        return "cpu"
    return recorded


def recorded_cache(trace: Trace, source: str) -> str:
    """The `--impl` name of the cache a trace was recorded on, when that cache can run here (for
    SGLang: the same release installed); UsageError naming what is missing otherwise."""
    if not trace.impl.startswith("sglang"):
        return trace.impl
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version

    recorded = f"{trace.impl} (SGLang {trace.impl_version})"
    reason = sglang_unavailable()
    if reason:
        raise UsageError(f"{source} was recorded on {recorded}, which cannot run here: {reason}; "
                         f"or replay it on another cache with --impl")
    if sglang_version() != trace.impl_version:
        raise UsageError(f"{source} was recorded on {recorded}, but SGLang {sglang_version()} is installed: install "
                         f"{trace.impl_version} to reproduce it, or replay it on {sglang_version()} with --impl {trace.impl}")
    return trace.impl


def run_replay(args, out: TextIO) -> int:
    trace = load_trace(args.file)
    pinned = {name: getattr(args, name) for name in SERVER_SETTINGS if getattr(args, name) is not None}
    if pinned:
        try:
            trace = replace(trace, config=replace(trace.config, **pinned))
        except ValueError as exc:
            raise UsageError(f"{args.file} with {setting_flags(pinned)}: {exc}") from None
    try:
        where = ""
        if args.impl is None and args.tree_core is None:
            args.impl = recorded_cache(trace, args.file)
            where = f" {trace.impl_version}, where it was recorded, with its settings (--impl names another cache),"
        args.impl = impl_name(args.impl or "sglang", args.tree_core)
        factory = cache_factory(args.impl)
        refusal = protocol_class(replay_protocol(trace, factory, args.protocol)).refusal(factory, trace.scheduler, trace.config)
        if refusal:
            raise ValueError(refusal)
        device = replay_device(args.device, trace.config.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    protocol = replay_protocol(trace, factory, args.protocol)
    if args.impl.startswith("sglang"):
        from harness.caches.sglang_loader import development_note

        note = development_note()
        if note:
            print(f"note: {note}", file=sys.stderr)
    if args.to_script:
        from harness.reproducer import ScriptError, to_script

        try:
            out.write(to_script(trace, factory, args.file, args.protocol))
        except ScriptError as exc:
            raise UsageError(f"--to-script: {exc}") from None
        return 0
    if args.to_pytest:
        stem = "".join(c if c.isalnum() else "_" for c in os.path.basename(args.file).removesuffix(".json"))
        out.write(to_pytest(trace, f"replay_{stem}", protocol))
        return 0

    def show(step: int, entry, driver) -> None:
        out.write(f"step {step}: {_call(entry)}\n")
        if args.verbose:
            for line in driver.cut.format_tree().splitlines():
                out.write(f"    {line}\n")

    out.write(
        f"replaying {args.file}: {len(trace.operations)} operations against {args.impl}{where} under "
        f"{protocol_class(protocol).title()} on {device}\n"
    )
    verdict = replay(trace, factory, device=device, protocol=protocol, on_step=show, source=args.file)
    if verdict.ok:
        out.write(f"OK: all {verdict.steps_run} operations replayed, every check held\n")
        return 0
    failing = trace.operations[verdict.failure.step] if verdict.failure.step >= 0 else None
    if failing is not None:
        out.write(f"step {verdict.failure.step}: {_call(failing)}\n")
    out.write(explain(verdict) + "\n")
    return 1


def run_fuzz(args, out: TextIO) -> int:
    from harness.fuzz import FuzzOptions, fuzz

    seconds = args.seconds if args.seconds is not None else 60.0 * (args.minutes if args.minutes is not None else 1.0)
    try:
        impl = impl_name(args.impl, args.tree_core)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = FuzzOptions(
        seconds=seconds,
        impl=impl,
        protocol=args.protocol,
        profile=args.profile,
        configs=args.config or sorted(SCENARIOS),
        seed=args.seed,
        db=args.db,
        report=args.report,
        engine=args.engine,
        workers=args.workers if args.workers is not None else (os.cpu_count() or 1),
        fail_fast=args.fail_fast,
        fail_on_known=args.fail_on_known,
        set_aside=args.set_aside,
        mamba_strategy=args.mamba_strategy,
        event_loop=args.event_loop,
        page_size=args.page_size,
    )
    if args.device:
        options.device = args.device
    if args.trace_dir:
        options.trace_dir = args.trace_dir
    try:
        report = fuzz(options, out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if report["interrupted"]:
        return EXIT_STATUS[report["interrupted"]]
    return 1 if report["failures"] else 0


def run_releases(args, out: TextIO) -> int:
    """Replay a trace (or fuzz) on every release from --from to --to, each in its own process."""
    from harness.caches.sglang_releases import RELEASES, release_range
    from harness.releases.history import print_summary, print_table, summarize
    from harness.releases.runner import run_releases as run_each
    from harness.releases.store import ReleaseStore

    if (args.trace is None) == (args.fuzz is None):
        raise UsageError("releases: give a TRACE to replay, or --fuzz SECONDS (not both)")
    first, last = args.first or RELEASES[0], args.last or RELEASES[-1]
    try:
        versions = release_range(first, last)
    except ValueError as exc:
        raise UsageError(f"releases: {exc}") from None
    if not versions:
        raise UsageError(f"releases: no release from {first} to {last}; known: {RELEASES[0]} .. {RELEASES[-1]}")
    if args.trace is not None:
        load_trace(args.trace)  # a bad file is refused here, before any release runs
        worker_args = ["replay", os.path.abspath(args.trace)]
        timeout = 600.0
    else:
        worker_args = ["fuzz", str(args.fuzz)] + ([] if args.seed is None else ["--seed", str(args.seed)])
        worker_args += ["--trace-dir", os.path.abspath(args.trace_dir)]
        timeout = 4 * args.fuzz + 600.0  # every cache of a release, then shrinking
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)

    def progress(version: str, results) -> None:
        print(f"{version}: " + ", ".join(f"{r['cache']} {r['status']}" for r in results), file=sys.stderr, flush=True)

    results = run_each(ReleaseStore(), versions, worker_args, jobs, timeout, on_done=progress)
    summaries = summarize(results)
    if args.json:
        json.dump({"trace": args.trace, "fuzz_seconds": args.fuzz, "results": results, "summary": summaries}, out, indent=1)
        out.write("\n")
    else:
        print_table(results, out)
        out.write("\n")
        print_summary(summaries, out)
    return 1 if any(r["status"] == "failed" for r in results) else 0


def _budget(text: str) -> float:
    """An argparse type: a positive, finite number (of minutes or seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
    return value


IMPL_HELP = (
    "impl (default), sglang (SGLang's own cache, when installed), sglang-CORE (its UnifiedRadixCache on tree core "
    "CORE) or MODULE:CLASS, a subclass of impl's MambaRadixCache"
)
TREE_CORE_HELP = (
    "with --impl sglang: SGLang's UnifiedRadixCache on its python or rust tree core, or parity (both side by side, "
    "failing at the first difference); the same as --impl sglang-CORE"
)
PROTOCOL_HELP = f"scheduler protocol, one of {sorted(PROTOCOLS)} (default: the cache's own: contract for impl, the release's for sglang)"


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m harness",
        description="Hybrid radix cache harness. With no command: `fuzz` with its defaults (the main job: "
        "one minute, impl against the model, one worker per core).",
    )
    sub = parser.add_subparsers(dest="command")
    fz = sub.add_parser("fuzz", help="fuzz a cache against the model for a time budget (the main job)",
                        description="Fuzz a cache against the model for the whole budget; each distinct failure is "
                        "shrunk once and set aside. Exit 0: no new failure; 1: new failures (each with its trace; known "
                        "findings too with --fail-on-known); 2: unusable options.")
    budget = fz.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=_budget, help="time budget in minutes (default 1)")
    budget.add_argument("--seconds", type=_budget, help="time budget in seconds")
    fz.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    fz.add_argument("--impl", default="impl", help=IMPL_HELP)
    fz.add_argument("--tree-core", default=None, choices=TREE_CORES, help=TREE_CORE_HELP)
    fz.add_argument("--protocol", default=None, help=PROTOCOL_HELP)
    fz.add_argument("--profile", default="nightly", choices=PROFILES,
                    help="Hypothesis profile, for the program length (default nightly)")
    fz.add_argument("--config", action="append", choices=sorted(SCENARIOS), metavar="CONFIG",
                    help=f"configuration to fuzz (repeatable; default: rotate through all of {', '.join(sorted(SCENARIOS))})")
    fz.add_argument("--seed", type=int, default=None, help="seed for reproducible runs")
    fz.add_argument("--db", default=None, help="example database: a directory (default .hypothesis/fuzz) or redis://host:port/n")
    fz.add_argument("--report", default=None, help="write a JSON report here")
    fz.add_argument("--engine", default="hypothesis", choices=("hypothesis", "random"), help="the engine (default hypothesis)")
    fz.add_argument("--workers", type=int, default=None, help="processes sharing the database (default: one per core)")
    fz.add_argument("--fail-fast", action="store_true",
                    help="stop at the first failure that fails the run (else each distinct failure is set aside and the fuzz goes on)")
    fz.add_argument("--fail-on-known", action="store_true",
                    help="known findings of the release fail the run too (else only new failure signatures do)")
    fz.add_argument("--mamba-strategy", default=None, choices=MAMBA_STRATEGIES,
                    help="every program's Mamba strategy (default: drawn among those the cache and protocol take, "
                         "weighted toward what SGLang serves: extra_buffer, for its UnifiedRadixCache under its own scheduler, 0.5.16 on)")
    fz.add_argument("--event-loop", default=None, choices=EVENT_LOOPS,
                    help="every program's event loop (default: drawn like the strategy, overlap most often where the "
                         "extra buffer is drawn; no_buffer runs the normal loop only)")
    fz.add_argument("--page-size", default=None, type=int, choices=PAGE_SIZES,
                    help="every program's page size (default: drawn like the strategy, 1, 4 or 16 with the extra buffer; "
                         "no_buffer takes page size 1 only)")
    fz.add_argument("--trace-dir", default=None, help="where failure traces go (default tests/regressions/pending)")
    fz.add_argument("--set-aside", action="append", default=[], metavar="FINDING|TRACE.json|SIGNATURE",
                    help="set aside a known finding of the release under test ('all': every one; docs/findings.md), the "
                    "failure a trace file records, or a failure signature as a fuzz prints it ('check | what ...'); repeatable")
    fz.set_defaults(run=run_fuzz)
    rp = sub.add_parser("replay", help="replay a trace file with every check on")
    rp.add_argument("file")
    rp.add_argument("--impl", default=None, help=IMPL_HELP + "; default: the cache and release the trace was recorded on")
    rp.add_argument("--tree-core", default=None, choices=TREE_CORES, help=TREE_CORE_HELP)
    rp.add_argument("--protocol", default=None, help="scheduler protocol (default: the trace's on the cache that recorded it, else the cache's own)")
    rp.add_argument("--device", default=None, help="torch device (default: the trace's)")
    rp.add_argument("--mamba-strategy", default=None, choices=MAMBA_STRATEGIES, help="the Mamba strategy (default: the trace's)")
    rp.add_argument("--event-loop", default=None, choices=EVENT_LOOPS, help="the event loop (default: the trace's)")
    rp.add_argument("--page-size", default=None, type=int, choices=PAGE_SIZES, help="the page size (default: the trace's)")
    rp.add_argument("--verbose", action="store_true", help="print the tree after every operation")
    emit = rp.add_mutually_exclusive_group()
    emit.add_argument("--to-pytest", action="store_true", help="print the trace as a standalone pytest function (our regression tests)")
    emit.add_argument("--to-script", action="store_true",
                      help="print a standalone Python file that imports only SGLang and torch and reproduces the failure "
                      "of a trace recorded on SGLang (for upstream)")
    rp.set_defaults(run=run_replay)
    rl = sub.add_parser("releases", help="replay a trace (or fuzz) on every SGLang release, each in its own process",
                        description="Replay TRACE on every SGLang release from --from to --to (fetched into the release "
                        "store on first use), on every cache each release ships; print release -> passed / failed "
                        "(check, step) / cannot run (why), then the first failing and first fixed release and any "
                        "regression. Exit 0: it passed everywhere; 1: it failed somewhere; 2: unusable options.")
    rl.add_argument("trace", nargs="?", default=None, help="the trace file to replay")
    rl.add_argument("--from", dest="first", default=None, help="first release (default: the oldest, 0.5.3.post2)")
    rl.add_argument("--to", dest="last", default=None, help="last release (default: the newest)")
    rl.add_argument("--json", action="store_true", help="print the results and the history as JSON")
    rl.add_argument("--fuzz", type=_budget, default=None, metavar="SECONDS",
                    help="instead of a trace: fuzz every cache of each release for SECONDS (known findings set aside)")
    rl.add_argument("--seed", type=int, default=None, help="with --fuzz: seed for reproducible runs")
    rl.add_argument("--trace-dir", default="tests/regressions/pending", help="with --fuzz: where failure traces go")
    rl.add_argument("--jobs", type=int, default=None, help="releases run at a time (default: one per core)")
    rl.set_defaults(run=run_releases)
    return parser


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv or ["fuzz"])
    try:
        return args.run(args, out)
    except (TraceError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a replay, or a fuzz before it took over SIGINT
        print("interrupted", file=sys.stderr)
        return EXIT_STATUS["SIGINT"]
