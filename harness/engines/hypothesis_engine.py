"""The Hypothesis engine: a state machine whose one `step` rule is the next scheduler event.

`step` draws an operation from the scenario's weighted mix (Hypothesis rules carry no weights),
then the operation draws its own arguments with labels, so a shrunk failure prints as a readable
program. After every step, every check runs. The cyclic collector is paused for the machine's
life (the memory check needs it), and the program's trace is written on the final, shrunk run.
A failure whose signature is set aside (`SetAside.covers`) ends the program quietly: the event
`set aside: KEY`, and the steps left do nothing. A failure raised carries its signature
(`harness_signature`).

`machine_for(scenario)` builds the machine class for one configuration; `cache_factory` points
it at another cache under test (a planted bug, SGLang), `protocol` at another scheduler.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

from hypothesis import event, strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.caches import CacheFactory, ImplCache
from harness.driver import CHECKS, Driver, pause_gc, resume_gc
from harness.findings import SetAside
from harness.profiles import PROJECT_ROOT
from harness.program import OperationChooser
from harness.trace import failure_trace, save_trace
from strategies import Scenario
from strategies.draws import HypothesisDraws

# the paths the reach test requires, scheduler events and cache rules alike
REACH_LABELS = (
    "node split",
    "tombstone created",
    "cascade deletion of a tombstone ancestor",
    "Mamba evicted from an internal node (tombstoned)",
    "KV allocation short: evicted, then retried",
    "Mamba allocation short: evicted, then retried",
    "cow into a new slot",
    "cow into a full Mamba pool: evicted a state",
    "insert onto a tombstone",
    "mamba_exist=True",
    "chunked prefill step",
    "a running request's insert split a node",
    "chunked request's slot given back between chunks",
    "a matched request refused by the prefill budget",
    "input too long: aborted, one token prefilled",
    "finish at the end of prefill",
    "finish after decode",
    "retraction under decode memory pressure",
    "abort of a waiting request",
    "abort of a request in chunked prefill",
    "abort of a request in decode",
    "abort of a bootstrapping request",
    "abort of a request in KV transfer",
    "KV transfer done",
    "idle self-check",
    "cache flushed",
    "misuse refused",
    "lock on an evicted node refused",
)
# the paths only SGLang 0.5.4's scheduler takes: a refused request keeps its copy-on-write slot
RELEASE_0_5_4_LABELS = ("cow into an existing slot", "abort of a waiting request holding a Mamba slot")
# the extra buffer's paths (`--mamba-strategy extra_buffer`), under a release's own scheduler
EXTRA_BUFFER_LABELS = ("track boundary crossed", "slot donated", "finished with no tracked state", "released without caching")
# paged KV (page size > 1), under the release's own scheduler (its keys are whole pages with the
# extra buffer and its extends start on a page, so a key cut to pages or an extend into a partial
# page, rules of the model, are not among them)
PAGED_LABELS = ("paged split", "sub-page prompt", "decode starts a page")

PENDING_DIR = os.path.join(PROJECT_ROOT, "tests", "regressions", "pending")


class CacheMachine(RuleBasedStateMachine):
    """Base machine; concrete ones come from `machine_for`."""

    scenario: Scenario
    cache_factory: CacheFactory = ImplCache
    protocol: Optional[str] = None
    device: str = "cpu"
    event_sink: Callable[[str], None] = staticmethod(event)
    trace_dir: Optional[str] = None  # None: $HARNESS_TRACE_DIR, else tests/regressions/pending
    set_aside: SetAside = SetAside()
    checks: frozenset = CHECKS

    def __init__(self):
        super().__init__()
        self.driver: Optional[Driver] = None
        self.chooser = OperationChooser(self.scenario)
        self.failed = False
        self.ended = False  # a failure set aside ended the program
        self._gc_was_enabled = pause_gc()

    @initialize(data=st.data())
    def build_cache(self, data):
        draws = HypothesisDraws(data)
        config = draws.config(self.scenario, self.device)
        scheduler = self.set_aside.settings(draws.scheduler(self.scenario, config))
        self.event_sink("program")
        self.driver = Driver(config, scheduler, type(self).cache_factory, self.protocol, self.event_sink, self.set_aside, self.checks)

    @rule(data=st.data())
    def step(self, data):
        if self.ended:
            return
        op, args = self.chooser.next(self.driver, HypothesisDraws(data))
        self.event_sink(f"operation: {op}")
        self._capturing(lambda: self.driver.apply(op, **args))

    def _capturing(self, action: Callable[[], Any]) -> None:
        """Run `action`; on the final (shrunk) failing run, save the trace of what ran."""
        try:
            action()
        except Exception as exc:
            signature = self.driver.signature(exc)
            if self.driver.set_aside.covers(signature):
                self.ended = True
                self.event_sink(f"set aside: {signature.key}")
                return
            exc.harness_signature = signature
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
    def every_check_holds(self):
        if self.driver is not None and not self.ended:
            self._capturing(self.driver.check)

    def teardown(self):
        try:
            if self.driver is not None and not (self.failed or self.ended):
                self._capturing(self.driver.check)
        finally:
            self.driver = None
            resume_gc(self._gc_was_enabled)


def machine_for(
    scenario: Scenario,
    cache_factory: CacheFactory = ImplCache,
    device: str = "cpu",
    event_sink: Optional[Callable[[str], None]] = None,
    name: Optional[str] = None,
    trace_dir: Optional[str] = None,
    protocol: Optional[str] = None,
    set_aside: SetAside = SetAside(),
    checks: frozenset = CHECKS,
) -> type:
    """A `CacheMachine` subclass for one scenario, cache under test, device, protocol, set of
    known findings set aside and checks run."""
    attrs = {
        "scenario": scenario,
        "cache_factory": cache_factory,
        "device": device,
        "trace_dir": trace_dir,
        "protocol": protocol,
        "set_aside": set_aside,
        "checks": checks,
    }
    if event_sink is not None:
        attrs["event_sink"] = staticmethod(event_sink)
    return type(name or f"CacheMachine_{scenario.name}", (CacheMachine,), attrs)


def noted_trace_path(exc: BaseException) -> Optional[str]:
    """The trace file a state-machine failure's notes name (written on its final run)."""
    for note in getattr(exc, "__notes__", []):
        match = re.search(r"Trace written to (\S+)", note)
        if match:
            return match.group(1)
    return None
