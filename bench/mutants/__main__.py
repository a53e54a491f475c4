"""`python -m bench.mutants`: hunt every seeded bug (or those named) and print the table.

    python -m bench.mutants [--profile ci] [--engine hypothesis|random] [--only NAME ...]
                            [--workers N] [--device cpu|cuda] [--seed N] [--json FILE]

Each mutant is hunted in a fresh process (the patch never leaks into another run): the
configurations are tried in turn, each with the profile's full budget (examples x steps), until
one fails. Exit status 0 when every mutant was caught, 1 when any survived, 2 for unusable
arguments.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, TextIO

from bench import parse_with_device
from bench.mutants.catalogue import BY_NAME, MUTANTS
from bench.mutants.hunt import report
from harness.profiles import PROFILES
from harness.usage import CommandParser


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    parser = CommandParser(prog="python -m bench.mutants", description="hunt the seeded bugs of bench/mutants and print the table")
    parser.add_argument("--profile", default="ci", choices=PROFILES, help="Hypothesis profile: each configuration's budget (default ci)")
    parser.add_argument("--engine", default="hypothesis", choices=("hypothesis", "random"))
    parser.add_argument("--only", action="append", metavar="NAME", help="hunt only this mutant (repeatable)")
    parser.add_argument("--workers", type=int, default=None, help="mutants hunted at once, each in its own process (default one per core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random engine's programs")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parse_with_device(parser, argv)
    unknown = [name for name in args.only or () if name not in BY_NAME]
    if unknown:
        parser.error(f"--only: unknown mutant(s) {unknown}; known: {sorted(BY_NAME)}")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    names = args.only or [m.name for m in MUTANTS]
    workers = args.workers or os.cpu_count() or 1
    return report(names, args.engine, args.profile, args.device, workers, args.seed, args.json, out)


if __name__ == "__main__":
    sys.exit(main())
