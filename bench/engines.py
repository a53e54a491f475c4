"""Steps per second of the two fuzz engines, side by side in one process.

    python -m bench.engines [--rounds 4] [--seconds 5] [--config medium] [--profile ci] [--device cpu|cuda] [--json FILE]

Each round runs the Hypothesis engine, then the random engine, for the same budget and seed
(rounds alternate, so a noisy machine slows both alike). Both run every check after every step. Prints each round's steps/s and ratio, the medians, and the ratio of the medians.
"""

from __future__ import annotations

import io
import statistics
import sys
import tempfile
from typing import Dict, List

from bench import parse_with_device, write_json
from harness.fuzz.options import FuzzOptions
from harness.fuzz.rounds import run_single
from harness.profiles import register_profiles
from harness.usage import CommandParser

ENGINES = ("hypothesis", "random")


def measure(rounds: int, seconds: float, configs: List[str], profile: str, impl: str, device: str) -> Dict[str, object]:
    register_profiles()
    rates: Dict[str, List[float]] = {engine: [] for engine in ENGINES}
    with tempfile.TemporaryDirectory() as scratch:
        for round_no in range(rounds):
            for engine in ENGINES:
                options = FuzzOptions(
                    seconds=seconds, device=device, impl=impl, profile=profile, configs=configs,
                    seed=round_no + 1, engine=engine, workers=1, trace_dir=scratch, db=f"{scratch}/db",
                )
                report = run_single(options, io.StringIO())
                rates[engine].append(report["steps"] / report["elapsed_seconds"])
    medians = {engine: statistics.median(values) for engine, values in rates.items()}
    return {
        "rounds": rounds,
        "seconds_per_run": seconds,
        "configs": configs,
        "profile": profile,
        "impl": impl,
        "device": device,
        "steps_per_second": rates,
        "round_ratios": [r / h for h, r in zip(rates["hypothesis"], rates["random"])],
        "median_steps_per_second": medians,
        "ratio_of_medians": medians["random"] / medians["hypothesis"],
    }


def main(argv: List[str] = None) -> int:
    parser = CommandParser(prog="python -m bench.engines", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--config", action="append", help="configuration(s) (default medium)")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--impl", default="impl")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parse_with_device(parser, argv)
    if args.rounds < 1 or args.seconds <= 0:
        parser.error(f"--rounds must be >= 1 and --seconds > 0, got {args.rounds} and {args.seconds}")
    print(f"engines on {args.device}, {args.seconds:g} s a run")
    result = measure(args.rounds, args.seconds, args.config or ["medium"], args.profile, args.impl, args.device)
    for i, (h, r) in enumerate(zip(result["steps_per_second"]["hypothesis"], result["steps_per_second"]["random"])):
        print(f"round {i + 1}: hypothesis {h:7.0f} steps/s   random {r:7.0f} steps/s   ratio {r / h:4.2f}x")
    medians = result["median_steps_per_second"]
    print(
        f"median: hypothesis {medians['hypothesis']:.0f} steps/s, random {medians['random']:.0f} steps/s, "
        f"ratio {result['ratio_of_medians']:.2f}x"
    )
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
