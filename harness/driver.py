"""`PairedScheduler`: scheduler operations applied to the cache under test and the model at once.

Each public method is one operation a serving scheduler performs (start a request, admit it,
prefill a chunk, decode, finish, abort) or a direct cache call (evict, insert, match, lock). It
makes the same calls SGLang's scheduler makes on the implementation, applies the model's twin,
compares every return value, and raises `Divergence` at the first disagreement. `check()` then
runs every invariant. Reach labels go to `on_event`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness.adapters import ImplAdapter
from harness.config import CacheConfig
from harness.invariants import InvariantViolation, RequestHoldings, check_all
from harness.operations import OperationError, check_arguments
from reference import ROOT, ModelMambaExhausted, ModelReq, ReferenceCache


class Divergence(AssertionError):
    """The implementation and the model disagreed about an operation's result."""

    def __init__(self, operation: str, what: str, impl_value: Any, model_value: Any):
        super().__init__(
            f"{operation}: {what} differs: implementation gave {impl_value!r}, model expected {model_value!r}"
        )
        self.operation = operation
        self.what = what


@dataclass
class LiveRequest:
    """A request in flight: its implementation object, its model twin and its phase."""

    rid: int
    impl_req: Any
    model_req: ModelReq
    phase: str  # "waiting" (matched and locked), "prefill", "decode"
    kv_len: int = 0  # positions of its row that hold KV


SEEN_LIMIT = 8  # matched nodes remembered for the lock-an-evicted-node misuse


@dataclass
class Pin:
    """A lock the harness took directly on a matched node."""

    node: Any
    path: Tuple


def _reuse(index: torch.Tensor) -> None:
    """The harness reuses an index tensor once a pool's free has returned, as a scheduler reuses
    its buffers: a pool must keep its own copy of what it was given, so scribbling on the
    caller's tensor (with a slot no pool has) must change nothing the checks see."""
    index.fill_(-1)


class PairedScheduler:
    """Drives one implementation adapter and one `ReferenceCache` with identical operations."""

    def __init__(
        self,
        config: CacheConfig,
        adapter_factory: Callable[[CacheConfig], Any] = ImplAdapter,
        on_event: Callable[[str], None] = lambda label: None,
    ):
        self.config = config
        self.adapter = adapter_factory(config)
        self.model = ReferenceCache(config.kv_size, config.mamba_size, config.req_size, self.adapter.rules)
        self.on_event = on_event
        self.requests: Dict[int, LiveRequest] = {}
        self.pins: List[Pin] = []
        self.seen: List[Pin] = []  # the last nodes plain matches returned, live or not since
        self.operations: List[Dict[str, Any]] = []  # every operation applied, in trace form
        self._next_rid = 0
        self._next_fingerprint = 1.0

    def apply(self, op: str, **args: Any) -> Any:
        """Record one operation of the vocabulary (`harness.operations`) and run it."""
        check_arguments(op, args)
        self.operations.append({"op": op, "args": dict(args)})
        return getattr(self, op)(**args)

    # ----- helpers ----------------------------------------------------------------------------

    def _agree(self, operation: str, what: str, impl_value: Any, model_value: Any) -> None:
        if impl_value != model_value:
            raise Divergence(operation, what, impl_value, model_value)

    def _flush_model_events(self) -> None:
        for label in self.model.events:
            self.on_event(label)
            if label in ("node split", "Mamba evicted from an internal node (tombstoned)"):
                self.on_event("tombstone created")
        self.model.events.clear()

    def _fingerprint(self) -> float:
        value = self._next_fingerprint
        self._next_fingerprint += 1.0
        return value

    def _set_state(self, live: LiveRequest) -> None:
        """A forward pass: the request's Mamba state becomes a fresh fingerprint."""
        value = self._fingerprint()
        self.adapter.fill_mamba(self.adapter.mamba_slot_of(live.impl_req), value)
        self.model.mamba_fill(live.model_req.mamba_slot, value)

    def _check_match(self, operation: str, tokens: Sequence[int], match, model_kv, model_last):
        got = tuple(match.device_indices.tolist())
        self._agree(operation, "matched KV slots", got, model_kv)
        self._agree(operation, "dtype of the matched KV slots", match.device_indices.dtype, torch.int64)
        self._agree(operation, "last node", self.adapter.path_of(match.last_device_node), model_last)
        # with no host tier, the host side of a match ends where the device side does
        self._agree(operation, "last host node", self.adapter.path_of(match.last_host_node), model_last)
        payload = self.adapter.read_kv(match.device_indices) if got else []
        if payload != list(tokens[: len(got)]):
            raise InvariantViolation(
                "data_integrity",
                f"{operation}: matched slots {list(got)} hold tokens {payload}, expected {list(tokens[: len(got)])}",
            )

    def _free_kv(self, slots: Sequence[int]) -> None:
        """Return KV slots the harness owns, in both."""
        if slots:
            index = self.adapter.indices(slots)
            self.adapter.kv.free(index)
            _reuse(index)
            self.model.free_kv(list(slots))

    def _free_mamba(self, slot: int) -> None:
        """Return a Mamba slot the harness owns, in both."""
        index = self.adapter.indices([slot])
        self.adapter.mamba_slots.free(index)
        _reuse(index)
        self.model.free_mamba([slot])

    def _evict_mamba_if_short(self) -> None:
        """With no Mamba slot free, evict one state first, as the scheduler does."""
        if self.adapter.mamba_slots.available_size() < 1:
            self.evict_mamba(1)
            self.on_event("Mamba allocation short: evicted, then retried")

    def _alloc_kv(self, operation: str, n: int) -> Optional[List[int]]:
        """Allocate n KV slots as the scheduler does: evict n tokens first when short."""
        if self.adapter.kv.available_size() < n:
            self.evict(n)
            self.on_event("KV allocation short: evicted, then retried")
        got = self.adapter.kv.alloc(n)
        want = self.model.kv_alloc(n)
        got_list = None if got is None else got.tolist()
        self._agree(operation, "KV allocation", got_list, want)
        if got is not None:
            self._agree(operation, "dtype of the KV allocation", got.dtype, torch.int64)
        if got_list is None:
            self.on_event("KV allocation failed even after evicting")
        return got_list

    def _alloc_mamba(self, operation: str) -> Optional[int]:
        self._evict_mamba_if_short()
        got = self.adapter.mamba_slots.alloc(1)
        want = self.model.mamba_alloc(1)
        got_list = None if got is None else got.tolist()
        self._agree(operation, "Mamba allocation", got_list, want)
        if got is not None:
            self._agree(operation, "dtype of the Mamba allocation", got.dtype, torch.int64)
        return None if got_list is None else got_list[0]

    def _release(self, live: LiveRequest) -> None:
        """Drop a request that cannot go on: free what it owns and its lock, in both."""
        owned = live.model_req.row
        self._free_kv([owned[i] for i in range(len(live.model_req.prefix), live.kv_len)])
        if live.model_req.req_slot is not None:
            self.adapter.free_req_slot(live.impl_req, free_mamba=True)
            self.model.req_free_slot(live.model_req, free_mamba=True)
        elif live.model_req.mamba_slot is not None:
            self._free_mamba(live.model_req.mamba_slot)
        self.adapter.dec_lock_ref(live.impl_req.last_node)
        self.model.dec_lock(live.model_req.last)
        del self.requests[live.rid]

    def _both_raise(self, operation: str, impl_call: Callable[[], Any], model_call: Callable[[], Any]) -> bool:
        """Run both; True if both ran out of Mamba slots, a Divergence if only one did."""
        impl_exhausted = model_exhausted = False
        try:
            impl_call()
        except self.adapter.mamba_exhausted_error as exc:
            if not self.adapter.is_mamba_exhausted(exc):
                raise
            impl_exhausted = True
        try:
            model_call()
        except ModelMambaExhausted:
            model_exhausted = True
        self._flush_model_events()
        self._agree(operation, "Mamba pool exhausted", impl_exhausted, model_exhausted)
        if impl_exhausted:
            self.on_event("Mamba pool exhausted with every state locked")
        return impl_exhausted

    def _live(self, rid: int, phase: str, operation: str) -> LiveRequest:
        """The live request `rid`, which must be in `phase` (else the operation does not fit)."""
        live = self.requests.get(rid)
        if live is None:
            raise OperationError("args.rid", f"{operation}: no live request {rid} (live: {sorted(self.requests)})")
        if live.phase != phase:
            raise OperationError("args.rid", f"{operation}: request {rid} is {live.phase}, not {phase}")
        return live

    # ----- request lifecycle ------------------------------------------------------------------

    def _match_and_lock(self, live: LiveRequest, cow: bool, operation: str) -> bool:
        """Match the request's input (all but its last token), with cow if asked, and lock the
        node found. False (and nothing locked) if the Mamba pool was exhausted in both."""
        impl_req, model_req = live.impl_req, live.model_req
        key = list(model_req.origin[:-1])
        result: Dict[str, Any] = {}

        def impl_call():
            result["impl"] = self.adapter.match_prefix(self.adapter.key(key, model_req.extra_key), impl_req if cow else None)

        def model_call():
            result["model"] = self.model.match_for_request(model_req, tuple(key), cow)

        if self._both_raise(operation, impl_call, model_call):
            return False
        match = result["impl"]
        model_kv, model_last = result["model"]
        self._check_match(operation, key, match, model_kv, model_last)
        self._agree(operation, "request's Mamba slot after cow", self.adapter.mamba_slot_of(impl_req), model_req.mamba_slot)
        self.adapter.adopt_match(impl_req, match)
        model_req.prefix, model_req.last = model_kv, model_last
        self.adapter.inc_lock_ref(impl_req.last_node)
        self.model.inc_lock(model_last)
        return True

    def start_request(self, tokens: Sequence[int], extra_key: Hashable = None, cow: bool = True) -> Optional[int]:
        """New request: match its input (all but the last token) with cow, lock the last node."""
        operation = f"start_request({list(tokens)}, extra_key={extra_key!r}, cow={cow})"
        if len(tokens) < 1:
            raise OperationError("args.tokens", f"a request needs at least one input token, got {list(tokens)}")
        rid = self._next_rid
        self._next_rid += 1
        live = LiveRequest(
            rid,
            self.adapter.new_req(rid, tokens, extra_key),
            ModelReq(rid=rid, origin=tuple(tokens), extra_key=extra_key),
            "waiting",
        )
        if not self._match_and_lock(live, cow, operation):
            return None
        self.requests[rid] = live
        return rid

    def rematch(self, rid: int) -> None:
        """A request still waiting is matched again, as SGLang's scheduler does every round:
        its lock moves to the node now found, and cow copies into the slot it already has."""
        operation = f"rematch(rid={rid})"
        live = self._live(rid, "waiting", operation)
        self.adapter.dec_lock_ref(live.impl_req.last_node)
        self.model.dec_lock(live.model_req.last)
        if not self._match_and_lock(live, True, operation):
            if live.model_req.mamba_slot is not None:
                self._free_mamba(live.model_req.mamba_slot)
            del self.requests[rid]

    def admit(self, rid: int, chunk: int, first_output: int = 0) -> bool:
        """Give a waiting request its request slot (evicting a Mamba state when short, as
        SGLang's alloc_req_slots does), write its prefix row and prefill its first chunk."""
        operation = f"admit(rid={rid}, chunk={chunk})"
        live = self._live(rid, "waiting", operation)
        self._evict_mamba_if_short()
        short = live.model_req.mamba_slot is None and self.adapter.mamba_slots.available_size() < 1
        if short and not self.adapter.req_alloc_fails_gracefully:
            # SGLang's scheduler admits only what its Mamba budget fits (its pool's alloc
            # cannot fail gracefully), so a request that still needs a slot waits
            self.on_event("request slot allocation failed")
            return False
        got = self.adapter.alloc_req_slot(live.impl_req)
        want = self.model.req_alloc(live.model_req)
        self._agree(operation, "request slot", got, want)
        if got is None:
            self.on_event("request slot allocation failed")
            return False
        self._agree(operation, "request's Mamba slot", self.adapter.mamba_slot_of(live.impl_req), live.model_req.mamba_slot)
        prefix = live.model_req.prefix
        if prefix:
            self.adapter.req_pool.write((got, slice(0, len(prefix))), live.impl_req.prefix_indices.to(self.adapter.req_pool.req_to_token.dtype))
        live.model_req.row = dict(enumerate(prefix))
        live.kv_len = len(prefix)
        live.phase = "prefill"
        if not self.prefill_chunk(rid, chunk, first_output):
            self.adapter.free_req_slot(live.impl_req, free_mamba=False)
            self.model.req_free_slot(live.model_req, free_mamba=False)
            live.phase = "waiting"
            return False
        return True

    def _compute(self, live: LiveRequest, operation: str, tokens: Sequence[int]) -> bool:
        """A forward pass over `tokens` at the request's next positions: KV slots for them
        (evicting when short), written to its row with their data, and a new Mamba state.
        False, with nothing changed, when no KV slots could be had."""
        slots = self._alloc_kv(operation, len(tokens))
        if slots is None:
            return False
        start = live.kv_len
        self.adapter.req_pool.write(
            (live.impl_req.req_pool_idx, slice(start, start + len(slots))),
            torch.tensor(slots, dtype=self.adapter.req_pool.req_to_token.dtype, device=self.adapter.device),
        )
        for offset, slot in enumerate(slots):
            live.model_req.row[start + offset] = slot
        self.adapter.write_kv(slots, tokens)
        live.kv_len += len(slots)
        self._set_state(live)
        return True

    def prefill_chunk(self, rid: int, chunk: int, first_output: int = 0) -> bool:
        """Compute the next `chunk` input tokens; cache them (chunked) or, when the input is
        done, emit the first output token and cache the whole input (non-chunked)."""
        operation = f"prefill_chunk(rid={rid}, chunk={chunk})"
        live = self._live(rid, "prefill", operation)
        origin = live.model_req.origin
        n = max(1, min(chunk, len(origin) - live.kv_len))
        if not self._compute(live, operation, origin[live.kv_len : live.kv_len + n]):
            return False
        done = live.kv_len == len(origin)
        live.impl_req.fill_ids = list(origin[: live.kv_len])
        live.model_req.fill = tuple(origin[: live.kv_len])
        if done:
            live.impl_req.output_ids.append(first_output)
            live.model_req.output.append(first_output)
            live.phase = "decode"
        else:
            self.on_event("chunked prefill step")
        if self._both_raise(
            operation,
            lambda: self.adapter.cache_unfinished_req(live.impl_req, chunked=not done),
            lambda: self.model.cache_unfinished_req(live.model_req),
        ):
            self._release(live)
            return True
        self._agree(operation, "prefix after caching", tuple(live.impl_req.prefix_indices.tolist()), live.model_req.prefix)
        self._agree(operation, "last node after caching", self.adapter.path_of(live.impl_req.last_node), live.model_req.last)
        return True

    def decode(self, rid: int, token: int) -> bool:
        """One decode step: a KV slot for the last output token, then a new output token."""
        operation = f"decode(rid={rid}, token={token})"
        live = self._live(rid, "decode", operation)
        if not self._compute(live, operation, [live.model_req.output[-1]]):
            return False
        live.impl_req.output_ids.append(token)
        live.model_req.output.append(token)
        return True

    def finish(self, rid: int) -> None:
        """The request is done: cache_finished_req."""
        live = self._live(rid, "decode", f"finish(rid={rid})")
        self.adapter.cache_finished_req(live.impl_req)
        self.model.cache_finished_req(live.model_req)
        self._flush_model_events()
        del self.requests[rid]

    def abort(self, rid: int) -> None:
        """A waiting request is cancelled: its lock and its own Mamba slot are released."""
        live = self._live(rid, "waiting", f"abort(rid={rid})")
        self._release(live)

    # ----- direct cache calls -----------------------------------------------------------------

    def evict(self, num_tokens: int) -> None:
        self.adapter.evict(num_tokens)
        self.model.evict(num_tokens)
        self._flush_model_events()

    def evict_mamba(self, num: int) -> None:
        self.adapter.evict_mamba(num)
        self.model.evict_mamba(num)
        self._flush_model_events()

    def insert(self, tokens: Sequence[int], extra_key: Hashable = None) -> None:
        """Raw insert with fresh KV and a fresh Mamba state; the caller frees what the tree
        did not take (the cached prefix's slots, unless the release's insert frees them, and
        the state if one existed)."""
        operation = f"insert({list(tokens)}, extra_key={extra_key!r})"
        kv = self._alloc_kv(operation, len(tokens))
        if kv is None:
            return
        mamba = self._alloc_mamba(operation)
        if mamba is None:
            self._free_kv(kv)
            return
        self.adapter.write_kv(kv, tokens)
        value = self._fingerprint()
        self.adapter.fill_mamba(mamba, value)
        self.model.mamba_fill(mamba, value)
        got = self.adapter.insert(self.adapter.key(tokens, extra_key), self.adapter.indices(kv), self.adapter.indices([mamba]))
        want = self.model.insert(tuple(tokens), extra_key, tuple(kv), mamba)
        self._flush_model_events()
        self._agree(operation, "(prefix_len, mamba_exist)", tuple(got), want)
        prefix_len, exist = want
        if not self.model.rules.insert_frees_duplicate_kv:
            self._free_kv(kv[:prefix_len])
        if exist:
            self._free_mamba(mamba)

    def _paired_match(self, operation: str, tokens: Sequence[int], extra_key: Hashable) -> Tuple[Any, Tuple]:
        """A plain match (no cow) in both, compared; returns (implementation node, model path)."""
        result = self.adapter.match_prefix(self.adapter.key(tokens, extra_key))
        model_kv, model_last = self.model.match_prefix(tuple(tokens), extra_key)
        self._flush_model_events()
        self._check_match(operation, tokens, result, model_kv, model_last)
        if model_last != ROOT:
            self.seen = [pin for pin in self.seen if pin.node is not result.last_device_node][-(SEEN_LIMIT - 1) :]
            self.seen.append(Pin(result.last_device_node, model_last))
        return result.last_device_node, model_last

    def match(self, tokens: Sequence[int], extra_key: Hashable = None) -> None:
        self._paired_match(f"match({list(tokens)}, extra_key={extra_key!r})", tokens, extra_key)

    def lock(self, tokens: Sequence[int], extra_key: Hashable = None) -> None:
        """Match and lock the matched node (as a scheduler holding a prefix would)."""
        node, path = self._paired_match(f"lock({list(tokens)}, extra_key={extra_key!r})", tokens, extra_key)
        self.adapter.inc_lock_ref(node)
        self.model.inc_lock(path)
        self.pins.append(Pin(node, path))

    def unlock(self, index: int) -> None:
        if index >= len(self.pins):
            raise OperationError("args.index", f"unlock: no pin {index} (pins held: {len(self.pins)})")
        pin = self.pins.pop(index)
        self.adapter.dec_lock_ref(pin.node)
        self.model.dec_lock(pin.path)

    def unlock_unlocked(self, tokens: Sequence[int], extra_key: Hashable = None) -> None:
        """Misuse: dec_lock_ref on a matched node that is not locked must be refused, and the
        cache must be exactly as before."""
        operation = f"unlock_unlocked({list(tokens)}, extra_key={extra_key!r})"
        node, path = self._paired_match(operation, tokens, extra_key)
        if path == ROOT or self.model.can_dec_lock(path):
            return
        self._refused(operation, "dec_lock_ref on an unlocked node", lambda: self.adapter.dec_lock_ref(node))

    def evicted_nodes(self) -> List[Pin]:
        """The remembered matched nodes that have left the tree since (their path is gone)."""
        return [pin for pin in self.seen if pin.path not in self.model.nodes]

    def lock_evicted(self, index: int) -> None:
        """Misuse: inc_lock_ref on a node matched earlier and evicted since must be refused, and
        the cache must be exactly as before."""
        operation = f"lock_evicted(index={index})"
        if not self.adapter.refuses_detached_nodes:
            raise OperationError("op", f"{operation}: the {self.adapter.name} cache does not check for evicted nodes")
        evicted = self.evicted_nodes()
        if index >= len(evicted):
            raise OperationError("args.index", f"{operation}: no evicted node {index} (remembered: {len(evicted)})")
        node = evicted[index].node
        self._refused(operation, "inc_lock_ref on an evicted node", lambda: self.adapter.inc_lock_ref(node))
        self.on_event("lock on an evicted node refused")

    def _refused(self, operation: str, what: str, call: Callable[[], Any]) -> None:
        """The misuse `call` must raise the adapter's misuse error and change nothing."""
        before = self.adapter.snapshot()
        try:
            call()
        except self.adapter.misuse_error:
            self.on_event("misuse refused")
        else:
            raise Divergence(operation, what, "accepted", "refused")
        self._agree(operation, "state after the refused call", self.adapter.snapshot(), before)

    # ----- checks -----------------------------------------------------------------------------

    def holdings(self) -> List[RequestHoldings]:
        """What each live request owns, after checking its req_to_token row against the model."""
        # SGLang's dtypes for the request rows and the request-to-Mamba map; a float one would
        # round slot ids past 2**24
        for name in ("req_to_token", "req_index_to_mamba_index_mapping"):
            dtype = getattr(self.adapter.req_pool, name).dtype
            if dtype != torch.int32:
                raise InvariantViolation("pool_conservation", f"{name} holds {dtype}, not torch.int32")
        live_requests = list(self.requests.values())
        holding_slots = [live.kv_len for live in live_requests if live.model_req.req_slot is not None]
        table = self.adapter.req_rows(max(holding_slots)) if holding_slots else []
        out = []
        for live in live_requests:
            model_req = live.model_req
            want = list(map(model_req.row.__getitem__, range(live.kv_len)))
            out.append(RequestHoldings(live.rid, tuple(want[len(model_req.prefix) :]), model_req.mamba_slot, model_req.req_slot))
            if model_req.req_slot is not None:
                got = table[live.impl_req.req_pool_idx][: live.kv_len]
                if got != want:
                    raise InvariantViolation(
                        "pool_conservation", f"request {live.rid}'s req_to_token row is {got}, expected {want}"
                    )
        return out

    def check(self) -> None:
        """Every invariant, recomputed from the implementation's state."""
        check_all(
            self.adapter.snapshot(),
            self.model,
            self.holdings(),
            self.adapter.kv_payload(),
            self.adapter.mamba_states(),
        )
