"""Steps per second under SGLang's own scheduler (`--protocol scheduler`) beside the hand-written
protocol of the same release, the same programs, side by side in one process.

    SGLANG_MAMBA_SSM_DTYPE=float32 python -m bench.protocols [--programs 40] [--steps 200]
        [--rounds 3] [--config medium ...] [--tree-core python|rust] [--seed 1] [--json FILE]

Needs an SGLang release the real scheduler is built for (0.5.19 .. 0.5.23). The programs are drawn once,
by the random engine's chooser running under the hand-written protocol (`unified`); each round
then runs every program under each protocol in turn, every check after every step, the known
findings set aside. A program stops at its first failure under either protocol (the two
schedulers decide differently, so an `abort` may name a request one of them has finished), so
the step counts can differ; the figures are steps run over the seconds they took. The real
scheduler's time includes building it for each new pool configuration (every program draws its
own) and resetting it between programs. Where the release's cache is driven with the extra
buffer, the same programs run under the scheduler a third time on pools built with it (the Mamba
pool grown to hold the track slots).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from bench import parse_with_device, write_json
from harness.driver import Driver, paused_gc
from harness.findings import set_aside
from harness.program import OperationChooser
from harness.usage import CommandParser
from strategies import SCENARIOS
from strategies.scenarios import mamba_per_request
from strategies.config import CacheConfig, SchedulerConfig
from strategies.draws import RandomDraws

Program = Tuple[CacheConfig, SchedulerConfig, List[Tuple[str, Dict[str, Any]]]]


def draw_programs(count: int, steps: int, configs: List[str], factory: Any, protocol: str, seed: int, aside: Any, device: str) -> List[Program]:
    """`count` programs of up to `steps` operations, chosen as the random engine chooses them
    while running under `protocol` (a program ends before an operation that fails there)."""
    programs: List[Program] = []
    for i in range(count):
        scenario = SCENARIOS[configs[i % len(configs)]]
        draws = RandomDraws(random.Random(seed * 100_003 + i))
        config = draws.config(scenario, device)
        scheduler = aside.settings(draws.scheduler(scenario, config))
        chooser = OperationChooser(scenario)
        operations: List[Tuple[str, Dict[str, Any]]] = []
        with paused_gc():
            driver = Driver(config, scheduler, factory, protocol, set_aside=aside)
            try:
                for _ in range(steps):
                    op, args = chooser.next(driver, draws)
                    driver.apply(op, **args)
                    driver.check()
                    operations.append((op, args))
            except Exception:
                pass
        programs.append((config, scheduler, operations))
    return programs


EXTRA_BUFFER = "scheduler, extra_buffer"
OVERLAP = "scheduler, extra_buffer, overlap"  # what SGLang serves by default


def with_the_extra_buffer(programs: List[Program], event_loop: str = "normal") -> List[Program]:
    """The same programs on pools built with the extra buffer for `event_loop`, the Mamba pool
    grown to hold each request's track slots too (as `strategies.scenarios.pool_config` sizes it)."""
    out = []
    for config, scheduler, operations in programs:
        mamba_size = max(config.mamba_size, config.req_size * mamba_per_request("extra_buffer", event_loop))
        out.append((replace(config, mamba_strategy="extra_buffer", event_loop=event_loop, mamba_size=mamba_size), scheduler, operations))
    return out


def run_programs(programs: List[Program], factory: Any, protocol: str, aside: Any) -> Tuple[int, float]:
    """Run every program under `protocol`, every check after every step; (steps run, seconds)."""
    steps, started = 0, time.perf_counter()
    for config, scheduler, operations in programs:
        with paused_gc():
            driver = Driver(config, scheduler, factory, protocol, set_aside=aside)
            try:
                driver.check()
                for op, args in operations:
                    driver.apply(op, **args)
                    driver.check()
                    steps += 1
            except Exception:
                pass
    return steps, time.perf_counter() - started


def measure(programs: int, steps: int, rounds: int, configs: List[str], tree_core: str, seed: int, device: str) -> Dict[str, Any]:
    from harness.caches import cache_class, cache_factory, cache_release

    factory = cache_factory(f"sglang-{tree_core}")
    hand_written = cache_class(factory).default_protocol
    aside = set_aside(["all"], cache_release(factory))
    drawn = draw_programs(programs, steps, configs, factory, hand_written, seed, aside, device)
    # label -> (the protocol, the programs it runs)
    runs = {hand_written: (hand_written, drawn), "scheduler": ("scheduler", drawn)}
    if "extra_buffer" in cache_class(factory).settings_taken["mamba_strategy"]:
        runs[EXTRA_BUFFER] = ("scheduler", with_the_extra_buffer(drawn))
        runs[OVERLAP] = ("scheduler", with_the_extra_buffer(drawn, "overlap"))
    protocols = tuple(runs)
    run_programs(drawn[:1], factory, "scheduler", aside)  # the import and first build, not timed
    results: Dict[str, List[Tuple[int, float]]] = {p: [] for p in protocols}
    for _ in range(rounds):
        for label, (protocol, variant) in runs.items():
            results[label].append(run_programs(variant, factory, protocol, aside))
    rates = {p: [s / t for s, t in runs] for p, runs in results.items()}
    medians = {p: statistics.median(values) for p, values in rates.items()}
    return {
        "release": cache_release(factory),
        "cache": f"sglang-{tree_core}",
        "programs": programs,
        "operations_drawn": sum(len(ops) for _, _, ops in drawn),
        "steps_run": {p: [s for s, _ in runs] for p, runs in results.items()},
        "steps_per_second": rates,
        "median_steps_per_second": medians,
        "scheduler_over_hand_written": medians["scheduler"] / medians[hand_written],
        "protocols": list(protocols),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog="python -m bench.protocols", description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=40, help="programs drawn (default 40)")
    parser.add_argument("--steps", type=int, default=200, help="operations per program at most (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running every program under each protocol (default 3)")
    parser.add_argument("--config", action="append", help="configurations to draw from (default medium, chunked, decode_pressure)")
    parser.add_argument("--tree-core", default="python", choices=("python", "rust"), help="tree core (default python)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parse_with_device(parser, argv)
    if args.programs < 1 or args.steps < 1 or args.rounds < 1:
        parser.error(f"--programs, --steps and --rounds must be >= 1, got {args.programs}, {args.steps}, {args.rounds}")
    configs = args.config or ["medium", "chunked", "decode_pressure"]
    unknown = [c for c in configs if c not in SCENARIOS or SCENARIOS[c].disaggregation != ("null",)]
    if unknown:
        parser.error(f"--config: {unknown} are not configurations the real scheduler runs (it runs no disaggregation)")
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version

    from harness.real_scheduler import RELEASES

    reason = sglang_unavailable()
    if reason or sglang_version() not in RELEASES:
        parser.error(f"needs an SGLang release the real scheduler is built for ({sorted(RELEASES)}): {reason or 'installed: ' + sglang_version()}")
    result = measure(args.programs, args.steps, args.rounds, configs, args.tree_core, args.seed, args.device)
    hand_written = result["protocols"][0]
    print(f"SGLang {result['release']}, {result['cache']} on {args.device}: {args.programs} programs, {result['operations_drawn']} operations drawn, configurations {configs}")
    for i in range(args.rounds):
        cells = [f"{p} {result['steps_per_second'][p][i]:7.0f} steps/s ({result['steps_run'][p][i]} steps)" for p in result["protocols"]]
        print(f"round {i + 1}: " + "   ".join(cells))
    medians = result["median_steps_per_second"]
    print("median: " + ", ".join(f"{p} {medians[p]:.0f} steps/s" for p in result["protocols"])
          + f"; scheduler / {hand_written} {result['scheduler_over_hand_written']:.2f}x")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
