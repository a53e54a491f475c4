"""Harness throughput: state-machine steps per second, with every check, as the tree grows.

    python -m bench.throughput [--seconds 10] [--sizes tens hundreds thousands] [--device cpu|cuda]
                               [--seed 1] [--json FILE]

For each tree size, three runs side by side in one process, each for the same budget:
  bare        a Hypothesis state machine of the same shape (an initialize rule drawing a pool
              configuration, one step rule drawing an operation and its arguments) that does no
              cache work: the ceiling Hypothesis itself sets;
  hypothesis  the harness's state machine: impl and the model side by side under the contract
              scheduler, every check after every step;
  random      the random engine: the same operations and checks without Hypothesis.
Each program of the last two starts from a tree warmed to the size by seeded inserts through the
driver (their time is not counted). Prints steps/s, the ratios, and the mean tree size reached.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from bench import parse_with_device, write_json
from harness.caches import ImplCache
from harness.driver import Driver, paused_gc
from harness.engines.hypothesis_engine import machine_for
from harness.fuzz.progress import Stats
from harness.program import OperationChooser
from strategies import SCENARIOS, Scenario
from strategies.draws import RandomDraws
from strategies.scenarios import weighted_operations
from harness.usage import CommandParser

STEPS_PER_PROGRAM = 50


@dataclass(frozen=True)
class TreeSize:
    """A tree size to measure at: the scenario (pools roomy enough) and the nodes to warm to."""

    name: str
    nodes: int
    scenario: Scenario


def _sized(name: str, nodes: int) -> TreeSize:
    kv = nodes * 12 + 256
    mamba = nodes + 64
    return TreeSize(name, nodes, replace(SCENARIOS["medium"], name=name, kv=(kv, kv), mamba=(mamba, mamba), req=(4, 4), max_len=16))


SIZES: Dict[str, TreeSize] = {s.name: s for s in (_sized("tens", 30), _sized("hundreds", 300), _sized("thousands", 3000))}


class Clock:
    """Time spent warming trees, which the figures leave out."""

    def __init__(self):
        self.warm_seconds = 0.0
        self.node_counts: List[int] = []


def node_count(driver: Driver) -> int:
    return len(driver.model.nodes)


def warm(driver: Driver, size: TreeSize, seed: int, clock: Clock) -> None:
    """Grow the tree to at least `size.nodes` nodes with seeded direct inserts (recorded like
    any operation), then run every check once."""
    started = time.perf_counter()
    rng = random.Random(seed)
    vocab, max_len = size.scenario.vocab, size.scenario.max_len
    while node_count(driver) < size.nodes:
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(4, max_len))]
        driver.apply("insert", tokens=tokens, extra_key=None)
    driver.check()
    clock.warm_seconds += time.perf_counter() - started


def bare_machine(scenario: Scenario) -> type:
    """A state machine with the harness machine's shape and draws, doing no cache work."""
    ops = weighted_operations(scenario.mix, list(scenario.mix))
    tokens = st.lists(st.integers(0, scenario.vocab - 1), max_size=scenario.max_len)

    class BareMachine(RuleBasedStateMachine):
        @initialize(data=st.data())
        def build_cache(self, data):
            integer = lambda lo, hi: data.draw(st.integers(lo, hi))  # noqa: E731
            self.config = scenario.config(integer)
            self.scheduler = scenario.scheduler(integer, self.config)

        @rule(data=st.data())
        def step(self, data):
            data.draw(st.sampled_from(ops), label="operation")
            data.draw(tokens, label="tokens")
            data.draw(st.integers(0, scenario.max_chunk), label="chunk")

    return BareMachine


def harness_machine(size: TreeSize, device: str, stats: Stats, clock: Clock) -> type:
    base = machine_for(size.scenario, ImplCache, device, stats.record)

    class WarmMachine(base):
        @initialize(data=st.data())
        def build_cache(self, data):
            super().build_cache(data)
            warm(self.driver, size, data.draw(st.integers(0, 2**32 - 1), label="warm seed"), clock)

        def teardown(self):
            if self.driver is not None:
                clock.node_counts.append(node_count(self.driver))
            super().teardown()

    return WarmMachine


def _run_machine(machine: type, seconds: float, seed: int) -> None:
    budget = settings(
        deadline=None, database=None, max_examples=10**6, stateful_step_count=STEPS_PER_PROGRAM,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )
    deadline = time.perf_counter() + seconds
    round_no = 0
    while time.perf_counter() < deadline:
        machine._hypothesis_internal_use_seed = seed * 1_000_003 + round_no
        run_state_machine_as_test(machine, settings=settings(budget, max_examples=3))
        round_no += 1


def measure_bare(size: TreeSize, seconds: float, seed: int) -> float:
    counter = {"steps": 0}
    base = bare_machine(size.scenario)

    class Counted(base):
        @rule(data=st.data())
        def step(self, data):
            counter["steps"] += 1
            base.step(self, data)

    started = time.perf_counter()
    _run_machine(Counted, seconds, seed)
    return counter["steps"] / (time.perf_counter() - started)


def measure_hypothesis(size: TreeSize, device: str, seconds: float, seed: int) -> Dict[str, float]:
    stats, clock = Stats(), Clock()
    started = time.perf_counter()
    _run_machine(harness_machine(size, device, stats, clock), seconds, seed)
    elapsed = time.perf_counter() - started - clock.warm_seconds
    return {"steps_per_second": stats.steps / elapsed, "mean_nodes": _mean(clock.node_counts)}


def measure_random(size: TreeSize, device: str, seconds: float, seed: int) -> Dict[str, float]:
    stats, clock = Stats(), Clock()
    rng = random.Random(seed)
    checked = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        draws = RandomDraws(random.Random(rng.getrandbits(64)))
        config = draws.config(size.scenario, device)
        with paused_gc():
            driver = Driver(config, draws.scheduler(size.scenario, config), ImplCache, on_event=stats.record)
            warm(driver, size, rng.getrandbits(32), clock)
            chooser = OperationChooser(size.scenario)
            started = time.perf_counter()
            for _ in range(STEPS_PER_PROGRAM):
                op, args = chooser.next(driver, draws)
                stats.record(f"operation: {op}")
                driver.apply(op, **args)
                driver.check()
            checked += time.perf_counter() - started
            clock.node_counts.append(node_count(driver))
    return {"steps_per_second": stats.steps / checked, "mean_nodes": _mean(clock.node_counts)}


def _mean(values: List[int]) -> Optional[float]:
    return round(statistics.mean(values), 1) if values else None


def measure(sizes: List[str], device: str, seconds: float, seed: int) -> List[Dict[str, object]]:
    """One row per tree size: the three engines' steps/s, their ratios and the trees reached."""
    rows = []
    for name in sizes:
        size = SIZES[name]
        bare = measure_bare(size, seconds, seed)
        hyp = measure_hypothesis(size, device, seconds, seed)
        rnd = measure_random(size, device, seconds, seed)
        rows.append({
            "size": name,
            "warm_nodes": size.nodes,
            "bare_steps_per_second": round(bare, 1),
            "hypothesis_steps_per_second": round(hyp["steps_per_second"], 1),
            "random_steps_per_second": round(rnd["steps_per_second"], 1),
            "hypothesis_over_bare": round(hyp["steps_per_second"] / bare, 4),
            "random_over_hypothesis": round(rnd["steps_per_second"] / hyp["steps_per_second"], 2),
            "mean_nodes_hypothesis": hyp["mean_nodes"],
            "mean_nodes_random": rnd["mean_nodes"],
        })
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog="python -m bench.throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="budget of each run (default 10)")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parse_with_device(parser, argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    print(f"throughput on {args.device}, {args.seconds:g} s a run, {STEPS_PER_PROGRAM} steps a program")
    rows = measure(args.sizes, args.device, args.seconds, args.seed)
    print(f"{'tree':>10} {'nodes':>7} {'bare':>9} {'harness':>9} {'random':>9} {'harness/bare':>13} {'random/harness':>15}")
    for r in rows:
        print(
            f"{r['size']:>10} {r['mean_nodes_hypothesis'] or 0:>7.0f} {r['bare_steps_per_second']:>9.0f} "
            f"{r['hypothesis_steps_per_second']:>9.0f} {r['random_steps_per_second']:>9.0f} "
            f"{r['hypothesis_over_bare']:>13.3f} {r['random_over_hypothesis']:>14.2f}x"
        )
    print("steps/s; bare: Hypothesis alone (same machine shape, no cache work); harness: impl + model + every invariant "
          "after every step; random: the random engine; nodes: mean tree size at the end of a program")
    if args.json:
        write_json(args.json, {"device": args.device, "seconds_per_run": args.seconds, "seed": args.seed, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
