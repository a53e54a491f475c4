"""The random engine: seeded random programs, the same operations and checks as the Hypothesis
engine without its per-step overhead. A failing program is shrunk by delta debugging over its
operations (`harness.engines.shrink`) and saved as a trace. A failure whose signature is set
aside (`SetAside.covers`) ends its program quietly, with the event `set aside: KEY`."""

from __future__ import annotations

import random
from typing import Callable, Optional

from harness.caches import CacheFactory
from harness.driver import CHECKS, Driver, paused_gc
from harness.findings import SetAside
from harness.program import OperationChooser
from harness.engines.shrink import shrink_operations
from harness.signature import Signature
from harness.trace import Trace, failure_trace, save_trace
from strategies import Scenario
from strategies.draws import RandomDraws


class ProgramFailed(Exception):
    """A random program failed; `trace` is its shrunk trace, saved at `path`."""

    def __init__(self, check: str, message: str, trace: Trace, path: str, signature: Signature):
        super().__init__(f"[{check}] {message}")
        self.check, self.message, self.trace, self.path, self.signature = check, message, trace, path, signature


def random_program(
    scenario: Scenario,
    cache_factory: CacheFactory,
    rng: random.Random,
    steps: int,
    device: str,
    trace_dir: str,
    on_event: Callable[[str], None] = lambda label: None,
    protocol: Optional[str] = None,
    set_aside: SetAside = SetAside(),
    checks: frozenset = CHECKS,
    shrink: bool = True,
    claim: Callable[[Signature], bool] = lambda signature: True,
    shrink_until: Optional[float] = None,
) -> None:
    """One seeded random program of `steps` operations, every check after each. Raises
    `ProgramFailed` (its failure shrunk, unless told not to, and saved as a trace) when a step
    or check fails in a way `set_aside` does not cover and `claim` (asked before shrinking: a
    fuzz's other processes may have found it first) takes; shrinking stops at `shrink_until`."""
    draws = RandomDraws(random.Random(rng.getrandbits(64)))
    config = draws.config(scenario, device)
    scheduler = set_aside.settings(draws.scheduler(scenario, config))
    on_event("program")
    with paused_gc():
        driver = Driver(config, scheduler, cache_factory, protocol, on_event, set_aside, checks)
        chooser = OperationChooser(scenario)
        try:
            driver.check()
            for _ in range(steps):
                op, args = chooser.next(driver, draws)
                on_event(f"operation: {op}")
                driver.apply(op, **args)
                driver.check()
        except Exception as exc:
            failed = failure_trace(driver, exc, scenario.name)
        else:
            return
    signature = failed.failure.signature
    if driver.set_aside.covers(signature):
        on_event(f"set aside: {signature.key}")
        return
    if not claim(signature):
        return
    on_event("program failed")
    shrunk = shrink_operations(failed, cache_factory, driver.protocol_name, shrink_until) if shrink else failed
    path = save_trace(shrunk, trace_dir)
    raise ProgramFailed(failed.failure.check, failed.failure.message, shrunk, path, signature)


__all__ = ["ProgramFailed", "random_program"]
