"""The Hypothesis state machine: scheduler operations on the implementation and the model at once.

One `step` rule draws an operation from the scenario's weighted mix (Hypothesis rules carry no
weights), then the operation draws its own arguments with labels, so a shrunk failure prints as
a readable program. After every step, every invariant is recomputed from the implementation.

`machine_for(scenario)` builds the machine class for one configuration; `adapter_factory`
points it at another cache under test (a planted bug, or another implementation).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from hypothesis import event, strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.adapters import ImplAdapter
from harness.config import CacheConfig
from harness.driver import PairedScheduler
from harness.program import OperationChooser
from harness.trace import failure_trace, save_trace
from strategies import Scenario
from strategies.draws import HypothesisDraws

REACH_LABELS = (
    "node split",
    "tombstone created",
    "cascade deletion of a tombstone ancestor",
    "Mamba evicted from an internal node (tombstoned)",
    "KV allocation short: evicted, then retried",
    "cow into a new slot",
    "cow into an existing slot",
    "insert onto a tombstone",
    "mamba_exist=True",
    "chunked prefill step",
    "lock on an evicted node refused",
)

PENDING_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "regressions", "pending")


class CacheMachine(RuleBasedStateMachine):
    """Base machine; concrete ones come from `machine_for`."""

    scenario: Scenario
    adapter_factory: Callable[[CacheConfig], Any] = ImplAdapter
    device: str = "cpu"
    event_sink: Callable[[str], None] = staticmethod(event)
    trace_dir: Optional[str] = None  # None: $HARNESS_TRACE_DIR, else tests/regressions/pending

    def __init__(self):
        super().__init__()
        self.driver: Optional[PairedScheduler] = None
        self.chooser = OperationChooser(self.scenario)
        self.failed = False

    @initialize(data=st.data())
    def build_cache(self, data):
        config = HypothesisDraws(data).config(self.scenario, self.device)
        self.event_sink("program")
        self.driver = PairedScheduler(config, type(self).adapter_factory, on_event=self.event_sink)

    @rule(data=st.data())
    def step(self, data):
        op, args = self.chooser.next(self.driver, HypothesisDraws(data))
        self.event_sink(f"operation: {op}")
        self._capturing(lambda: self.driver.apply(op, **args))

    def _capturing(self, action: Callable[[], Any]) -> None:
        """Run `action`; on the final (shrunk) failing run, save the trace of what ran."""
        try:
            action()
        except Exception as exc:
            self.failed = True
            self.event_sink("program failed")
            if current_build_context().is_final:
                path = self._save_trace(exc)
                exc.add_note(f"Trace written to {path}\nReplay it with: python -m harness replay {path}")
                print(f"harness: trace written to {path}; replay with: python -m harness replay {path}")
            raise

    def _save_trace(self, exc: BaseException) -> str:
        directory = self.trace_dir or os.environ.get("HARNESS_TRACE_DIR") or PENDING_DIR
        return save_trace(failure_trace(self.driver, exc, self.scenario.name), directory)

    @invariant()
    def every_invariant_holds(self):
        if self.driver is not None:
            self._capturing(self.driver.check)

    def teardown(self):
        if self.driver is not None and not self.failed:
            self._capturing(self.driver.check)


def machine_for(
    scenario: Scenario,
    adapter_factory: Callable[[CacheConfig], Any] = ImplAdapter,
    device: str = "cpu",
    event_sink: Optional[Callable[[str], None]] = None,
    name: Optional[str] = None,
    trace_dir: Optional[str] = None,
) -> type:
    """A `CacheMachine` subclass for one scenario, cache under test and device."""
    attrs = {"scenario": scenario, "adapter_factory": adapter_factory, "device": device, "trace_dir": trace_dir}
    if event_sink is not None:
        attrs["event_sink"] = staticmethod(event_sink)
    return type(name or f"CacheMachine_{scenario.name}", (CacheMachine,), attrs)
