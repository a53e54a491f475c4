"""The Hypothesis state machine: scheduler operations on the implementation and the model at once.

One `step` rule draws an operation from the scenario's weighted mix (Hypothesis rules carry no
weights), then the operation draws its own arguments with labels, so a shrunk failure prints as
a readable program. After every step, every invariant is recomputed from the implementation.

`machine_for(scenario)` builds the machine class for one configuration; `adapter_factory`
points it at another cache under test (a planted bug, or another implementation).
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional

from hypothesis import event, strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.adapters import ImplAdapter
from harness.config import CacheConfig
from harness.driver import PairedScheduler
from harness.trace import Failure, Trace, classify, save_trace
from strategies import Scenario, choices, operations, sharing_prefixes

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
)

PENDING_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "regressions", "pending")
CORPUS_LIMIT = 24
WAITING_LIMIT = 3  # a scheduler admits or drops requests; an ever-growing queue only exhausts pools


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
        self.corpus: List[tuple] = []
        self.failed = False

    @initialize(data=st.data())
    def build_cache(self, data):
        config = data.draw(self.scenario.pools(self.device), label="config")
        self.driver = PairedScheduler(config, type(self).adapter_factory, on_event=self.event_sink)

    # ----- what can happen now ----------------------------------------------------------------

    def _in_phase(self, phase: str) -> List[int]:
        return sorted(rid for rid, live in self.driver.requests.items() if live.phase == phase)

    def _applicable(self) -> List[str]:
        ops = ["evict", "evict_mamba", "insert", "match", "lock", "unlock_unlocked"]
        waiting = self._in_phase("waiting")
        if len(waiting) < WAITING_LIMIT:
            ops.append("start_request")
        if waiting:
            ops += ["admit", "rematch", "abort"]
        if self._in_phase("prefill"):
            ops.append("prefill_chunk")
        decoding = self._decodable()
        if decoding:
            ops.append("decode")
        if self._in_phase("decode"):
            ops.append("finish")
        if self.driver.pins:
            ops.append("unlock")
        return ops

    def _decodable(self) -> List[int]:
        limit = self.driver.config.max_context_len - 1
        return [rid for rid in self._in_phase("decode") if self.driver.requests[rid].kv_len < limit]

    def _remember(self, tokens) -> None:
        tokens = tuple(tokens)
        if tokens and tokens not in self.corpus:
            self.corpus.append(tokens)
            del self.corpus[:-CORPUS_LIMIT]

    def _tokens(self, data, label: str, min_len: int = 1):
        s = self.scenario
        return data.draw(sharing_prefixes(self.corpus, s.vocab, s.max_len, min_len), label=label)

    def _extra_key(self, data):
        keys = self.scenario.extra_keys
        return keys[0] if len(keys) == 1 else data.draw(choices(keys), label="extra_key")

    def _request(self, data, rids: List[int]) -> int:
        return data.draw(choices(tuple(rids)), label="request")

    # ----- the step rule ----------------------------------------------------------------------

    @rule(data=st.data())
    def step(self, data):
        op = data.draw(operations(self.scenario.mix, self._applicable()), label="operation")
        self.event_sink(f"operation: {op}")
        self._capturing(getattr(self, f"do_{op}"), data)

    def _capturing(self, action: Callable, *args) -> None:
        """Run `action`; on the final (shrunk) failing run, save the trace of what ran."""
        try:
            action(*args)
        except Exception as exc:
            self.failed = True
            if current_build_context().is_final:
                path = self._save_trace(exc)
                exc.add_note(f"Trace written to {path}\nReplay it with: python -m harness replay {path}")
                print(f"harness: trace written to {path}; replay with: python -m harness replay {path}")
            raise

    def _save_trace(self, exc: BaseException) -> str:
        driver = self.driver
        trace = Trace(
            config=driver.config,
            operations=list(driver.operations),
            impl=getattr(driver.adapter, "name", "impl"),
            impl_version=driver.adapter.version(),
            scenario=self.scenario.name,
            failure=Failure(classify(exc), str(exc), len(driver.operations) - 1),
        )
        directory = self.trace_dir or os.environ.get("HARNESS_TRACE_DIR") or PENDING_DIR
        return save_trace(trace, directory)

    def do_start_request(self, data):
        tokens = self._tokens(data, "tokens")
        extra = self._extra_key(data)
        cow = data.draw(choices((True, True, True, False)), label="cow_mamba")
        self._remember(tokens)
        self.driver.apply("start_request", tokens=list(tokens), extra_key=extra, cow=cow)

    def do_admit(self, data):
        rid = self._request(data, self._in_phase("waiting"))
        chunk = data.draw(st.integers(1, self.scenario.max_chunk), label="chunk")
        first = data.draw(st.integers(0, self.scenario.vocab - 1), label="first_output")
        self.driver.apply("admit", rid=rid, chunk=chunk, first_output=first)

    def do_prefill_chunk(self, data):
        rid = self._request(data, self._in_phase("prefill"))
        chunk = data.draw(st.integers(1, self.scenario.max_chunk), label="chunk")
        first = data.draw(st.integers(0, self.scenario.vocab - 1), label="first_output")
        self.driver.apply("prefill_chunk", rid=rid, chunk=chunk, first_output=first)

    def do_decode(self, data):
        rid = self._request(data, self._decodable())
        token = data.draw(st.integers(0, self.scenario.vocab - 1), label="token")
        self.driver.apply("decode", rid=rid, token=token)

    def do_finish(self, data):
        rid = self._request(data, self._in_phase("decode"))
        live = self.driver.requests[rid]
        self._remember(live.model_req.origin + tuple(live.model_req.output))
        self.driver.apply("finish", rid=rid)

    def do_rematch(self, data):
        self.driver.apply("rematch", rid=self._request(data, self._in_phase("waiting")))

    def do_abort(self, data):
        self.driver.apply("abort", rid=self._request(data, self._in_phase("waiting")))

    def do_evict(self, data):
        self.driver.apply("evict", num_tokens=data.draw(st.integers(0, 2 * self.scenario.max_len), label="num_tokens"))

    def do_evict_mamba(self, data):
        self.driver.apply("evict_mamba", num=data.draw(st.integers(0, 3), label="num"))

    def do_insert(self, data):
        tokens = self._tokens(data, "tokens")
        self._remember(tokens)
        self.driver.apply("insert", tokens=list(tokens), extra_key=self._extra_key(data))

    def do_match(self, data):
        self.driver.apply("match", tokens=list(self._tokens(data, "tokens", min_len=0)), extra_key=self._extra_key(data))

    def do_lock(self, data):
        self.driver.apply("lock", tokens=list(self._tokens(data, "tokens")), extra_key=self._extra_key(data))

    def do_unlock(self, data):
        self.driver.apply("unlock", index=data.draw(st.integers(0, len(self.driver.pins) - 1), label="pin"))

    def do_unlock_unlocked(self, data):
        self.driver.apply("unlock_unlocked", tokens=list(self._tokens(data, "tokens")), extra_key=self._extra_key(data))

    # ----- invariants -------------------------------------------------------------------------

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
