"""`python -m bench.first_find`: how long the default fuzz takes to first find each known finding.

    python -m bench.first_find [--impl sglang] [--engine hypothesis|random ...] [--only NAME ...]
                               [--seconds S] [--device cpu|cuda] [--json FILE] [--trace-dir DIR]

For every known finding of the release under test (`harness.findings`), and each engine, one
fuzz runs with every *other* finding of the release set aside, the default profile and
configurations, one worker, stopping at its first failure: the seconds until that failure are
the time to first find. A first failure that is not the finding (another check failed) is
reported as such. Exit status 0 when every finding was found by every engine, 1 otherwise,
2 for unusable arguments.
"""

from __future__ import annotations

import io
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import List, Optional, TextIO

from bench import markdown_table, parse_with_device, write_json
from harness.caches import cache_factory, cache_release
from harness.findings import KNOWN_FINDINGS
from harness.fuzz import FuzzOptions, fuzz
from harness.fuzz.options import ENGINES
from harness.outputs import check_output_dir
from harness.trace import load_trace
from harness.usage import CommandParser


@dataclass
class FirstFind:
    """One finding, one engine: when the fuzz first failed, and with what."""

    finding: str
    engine: str
    found: bool
    seconds: Optional[float]  # from the start of the fuzz to its first failing program
    programs: Optional[int]  # programs run up to and including that one
    check: Optional[str]  # the check the first failure broke
    trace_operations: Optional[int]  # operations in its shrunk trace


def hunt(finding: str, engine: str, impl: str, release: str, seconds: float, device: str,
         trace_dir: Optional[str] = None) -> FirstFind:
    """Fuzz with every other finding of `release` set aside until the first failure; its trace
    goes to `trace_dir` (default: a temporary directory)."""
    others = [f.name for f in KNOWN_FINDINGS.values() if f.meets(release) and f.name != finding]
    with tempfile.TemporaryDirectory() as scratch:
        options = FuzzOptions(
            seconds=seconds, device=device, impl=impl, engine=engine, workers=1, fail_fast=True, fail_on_known=True,
            db=f"{scratch}/db", trace_dir=trace_dir or scratch, set_aside=others,
        )
        report = fuzz(options, io.StringIO())
        failures = report["failures"]
        first = failures[0] if failures else None
        length = len(load_trace(first["trace"]).operations) if first and first["trace"] else None
    wanted = KNOWN_FINDINGS[finding].check
    return FirstFind(
        finding=finding,
        engine=engine,
        found=first is not None and first["check"] == wanted,
        seconds=report["first_failure_seconds"],
        programs=report["first_failure_programs"],
        check=first["check"] if first else None,
        trace_operations=length,
    )


def table(results: List[FirstFind]) -> str:
    return markdown_table(
        ("finding", "engine", "found", "first failure (s)", "programs", "check", "shrunk trace (ops)"), "lllrrlr",
        ((f"`{r.finding}`", r.engine, "yes" if r.found else "**NO**", r.seconds, r.programs, r.check, r.trace_operations)
         for r in results),
    )


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    parser = CommandParser(prog="python -m bench.first_find", description="time to first find each known finding")
    parser.add_argument("--impl", default="sglang", help="the cache under test (default sglang: the installed release)")
    parser.add_argument("--engine", action="append", choices=ENGINES, help="engine (repeatable; default both)")
    parser.add_argument("--only", action="append", metavar="NAME", help="only this finding (repeatable)")
    parser.add_argument("--seconds", type=float, default=120.0, help="budget of each fuzz (default 120)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--trace-dir", default=None, help="keep each first failure's trace here")
    args = parse_with_device(parser, argv)
    if args.trace_dir:
        try:
            check_output_dir("--trace-dir", args.trace_dir)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        release = cache_release(cache_factory(args.impl))
    except ValueError as exc:
        parser.error(str(exc))
    known = [f.name for f in KNOWN_FINDINGS.values() if release in f.releases]
    unknown = [name for name in args.only or () if name not in known]
    if unknown:
        parser.error(f"--only: {unknown} not known findings of {args.impl} {release}; known: {known}")
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    results = [
        hunt(name, engine, args.impl, release, args.seconds, args.device, args.trace_dir)
        for name in args.only or known
        for engine in args.engine or ENGINES
    ]
    out.write(table(results) + "\n\n")
    found = sum(r.found for r in results)
    out.write(f"{found}/{len(results)} found ({args.impl} {release}, {args.device}, {args.seconds:.0f} s budget each)\n")
    if args.json:
        write_json(args.json, {"impl": args.impl, "release": release, "device": args.device, "seconds": args.seconds,
                               "results": [asdict(r) for r in results]})
    return 0 if found == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
