"""`PairedCaches`: every call a scheduler protocol makes, made on the cache under test and on the
reference model at once, with the answers compared.

A protocol (`harness.protocols`) is the release's scheduler transcribed: it decides what to call,
and calls it here. Each method makes the cache's own call (through the `CacheUnderTest`, which
passes the protocol's keyword arguments on verbatim) and the model's twin, compares what both
return, and raises `Divergence` at the first disagreement. A call that raises inside the cache
under test propagates as it is: in the release it would reach the scheduler the same way.

`Request` is one request as the scheduler holds it: the cache under test's `Req` object, the
model's `ModelReq` twin, and the scheduler's own bookkeeping. `forward` is the stand-in forward
pass: it writes digests (`harness.digest`) into the KV slots and the Mamba state it computes, and
first checks that the state it resumes from was computed for the request's own prefix.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness import digest
from harness.caches.base import CacheUnderTest
from harness.checks.meaning import wrong_slot
from harness.checks.violation import InvariantViolation
from reference import ROOT, ModelMambaExhausted, ModelReq, ReferenceCache, Rules
from strategies.config import CacheConfig

RECENT_NODES = 8


def model_as_built(config: CacheConfig, rules: Rules) -> ReferenceCache:
    """The model of a cache freshly built with `config`'s pools and server settings, under the
    cache's `rules`."""
    return ReferenceCache(config.kv_size, config.mamba_size, config.req_size, rules, config.tracking_slots, config.page_size)


def sglang_call(name: str) -> Callable:
    """Marks a `PairedCaches` method as one call the scheduler makes on the cache or a pool,
    named as SGLang's scheduler spells it (`tree_cache.match_prefix`): the call is logged in
    `PairedCaches.calls`, and an exception leaving it names it (`exc.sglang_call`, the
    innermost call's name: `harness.signature`)."""

    def mark(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: "PairedCaches", *args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                if getattr(exc, "sglang_call", None) is None:
                    exc.sglang_call = name
                raise

        return call

    return mark


class Divergence(AssertionError):
    """The cache under test and the model disagreed about a call's result."""

    def __init__(self, call: str, what: str, cut_value: Any, model_value: Any):
        super().__init__(f"{call}: {what} differs: the cache gave {cut_value!r}, the model expected {model_value!r}")
        self.call = call
        self.what = what


class ReleaseRaised(Exception):
    """The release's own scheduler code, as a protocol transcribes it, raises here (an assert, an
    out-of-memory error, its idle self-check): in serving the scheduler process dies. `kind` is
    the exception type the release raises, the message the release's."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class SchedulerOverload(AssertionError):
    """The cache and the model both ran out of Mamba slots: the scheduler asked for more states
    than the pool holds with every state locked."""


@dataclass(eq=False)
class Request:
    """One request as the scheduler holds it."""

    rid: int
    origin: Tuple[int, ...]
    extra_key: Optional[str]
    max_new_tokens: int
    cut: Any  # the cache under test's Req
    model: ModelReq
    output: List[int] = field(default_factory=list)
    prefix_len: int = 0  # len(req.prefix_indices)
    extend_len: int = 0  # req.extend_input_len
    fill_len: int = 0  # len(req.fill_ids)
    kv_len: int = 0  # positions of its row that hold KV it computed or shares
    is_chunked: int = 0
    to_abort: bool = False
    finished: Optional[str] = None  # finish reason, once finished
    released: bool = False  # cache_finished_req has taken it: it holds nothing any more
    # what the request's Mamba state was computed from: tokens()[:state_len]; None while the
    # state means nothing (a fresh slot, or none)
    state_len: Optional[int] = None

    def tokens(self) -> Tuple[int, ...]:
        return self.origin + tuple(self.output)


def _describe(kwargs: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={'req' if isinstance(v, Request) else repr(v)}" for k, v in kwargs.items())


class PairedCaches:
    """The cache under test and the model, called together."""

    def __init__(
        self,
        cut: CacheUnderTest,
        model: ReferenceCache,
        on_event: Callable[[str], None],
        check_meaning: bool = True,
        overwrite_handed: bool = True,
    ):
        self.cut = cut
        self.model = model
        self.on_event = on_event
        self.check_meaning = check_meaning  # whether the calls check what the data they hand out means
        # whether a tensor handed to the cache is overwritten once its caller is done with it
        # (`harness.checks.ownership`): a tree that kept it then changes
        self.overwrite_handed = overwrite_handed
        self.prefixes: Dict[int, Tuple[Hashable, Tuple[int, ...]]] = {}  # digest -> the prefix it is of
        self.recent_nodes: List[weakref.ref] = []  # the last nodes matches returned, held weakly
        self.calls: List[str] = []  # the calls made since the driver's last operation began (`sglang_call`)

    def _overwrite(self, *handed: torch.Tensor) -> None:
        """The caller is done with tensors it handed the cache: it reuses them (-1 everywhere)."""
        if self.overwrite_handed:
            for tensor in handed:
                tensor.fill_(-1)

    def remember(self, node: Any) -> None:
        """Keep a weak reference to a node a match returned (the lock-an-evicted-node misuse
        tries nodes that left the tree but are still referred to)."""
        node = self.cut.node_object(node) if self.cut.node_objects else None
        if node is not None and node is not self.cut.cache.root_node:
            alive = [r for r in self.recent_nodes if r() is not None and r() is not node]
            self.recent_nodes = alive[-(RECENT_NODES - 1) :] + [weakref.ref(node)]

    # ----- helpers ----------------------------------------------------------------------------

    def agree(self, call: str, what: str, cut_value: Any, model_value: Any) -> None:
        if cut_value != model_value:
            raise Divergence(call, what, cut_value, model_value)

    def same_node(self, call: str, what: str, node: Any, path) -> None:
        """The cache's `node` is the model's node `path`: the same path from the root or, for a
        tree whose nodes cannot be read, the same KV slots from the root."""
        if self.cut.opaque:
            self.agree(call, f"{what} (its KV slots from the root)", self.cut.node_kv(node), self.model.kv_of(path))
        else:
            self.agree(call, what, self.cut.path_of(node), path)

    def flush_events(self) -> None:
        for label in self.model.events:
            self.on_event(label)
            if label in ("node split", "Mamba evicted from an internal node (tombstoned)", "Mamba evicted from a KV-locked leaf (tombstoned)"):
                self.on_event("tombstone created")
        self.model.events.clear()

    def _both(self, call: str, cut_call: Callable[[], Any], model_call: Callable[[], Any]) -> Tuple[Any, Any]:
        """Run the cache's call, then the model's; reconcile running out of Mamba slots."""
        # the cache's message only: the exception itself, kept past its handler, would keep its
        # traceback's frames (and the nodes in them) alive in a reference cycle
        cut_exhausted: Optional[str] = None
        try:
            got = cut_call()
        except self.cut.mamba_exhausted_error as exc:
            if not self.cut.is_mamba_exhausted(exc):
                raise
            got, cut_exhausted = None, str(exc)
        try:
            want = model_call()
        except ModelMambaExhausted:
            self.flush_events()
            if cut_exhausted is None:
                raise Divergence(call, "running out of Mamba slots", "a slot", "none left")
            self.on_event("Mamba pool exhausted with every state locked")
            raise SchedulerOverload(f"{call}: no Mamba slot is left, even after evicting ({cut_exhausted})") from None
        self.flush_events()
        if cut_exhausted is not None:
            raise Divergence(call, "running out of Mamba slots", f"none left ({cut_exhausted})", "a slot")
        return got, want

    def record_digests(self, extra_key: Optional[str], tokens: Tuple[int, ...], start: int) -> List[int]:
        """The digest of every prefix of `tokens`; those from position `start` on, which a
        forward pass is about to write, are remembered for `name_digest`."""
        values = digest.digests(extra_key, tokens)
        for i in range(start, len(tokens)):
            self.prefixes[values[i]] = (extra_key, tokens[: i + 1])
        return values

    def name_digest(self, value: Optional[int]) -> str:
        """What a digest is of, when the harness wrote it."""
        if value is None:
            return "no digest"
        if value in self.prefixes:
            extra, tokens = self.prefixes[value]
            return f"the digest of {list(tokens)}" + ("" if extra is None else f" under {extra!r}")
        return f"digest {value} (of nothing the harness computed)"

    # ----- requests ---------------------------------------------------------------------------

    def new_request(self, rid: int, origin: Sequence[int], extra_key: Optional[str], max_new_tokens: int) -> Request:
        return Request(
            rid=rid,
            origin=tuple(origin),
            extra_key=extra_key,
            max_new_tokens=max_new_tokens,
            cut=self.cut.new_req(rid, origin, extra_key),
            model=ModelReq(rid=rid, origin=tuple(origin), extra_key=extra_key),
        )

    def set_fill(self, req: Request, n: int) -> None:
        """`req.fill_ids = (origin + output)[:n]`."""
        tokens = req.tokens()[:n]
        self.cut.set_fill(req.cut, tokens)
        req.model.fill = tokens
        req.fill_len = n

    def append_output(self, req: Request, token: int) -> None:
        self.cut.append_output(req.cut, token)
        req.model.output.append(token)
        req.output.append(token)

    def reset_for_retract(self, req: Request) -> None:
        self.cut.reset_for_retract(req.cut)
        req.model.prefix, req.model.last, req.model.mamba_slot = (), ROOT, None
        req.prefix_len = req.extend_len = req.kv_len = req.is_chunked = 0
        req.state_len = None
        req.released = False  # it goes back to the waiting queue, to be matched and run again

    def forget_req_slot(self, req: Request) -> None:
        self.cut.forget_req_slot(req.cut)

    # ----- what the scheduler reads -----------------------------------------------------------

    def read(self, what: str, cut_value: int, model_value: int) -> int:
        self.calls.append(what)
        try:
            self.agree(f"{what}()", "the value the scheduler read", cut_value, model_value)
        except Divergence as exc:
            exc.sglang_call = what
            raise
        return cut_value

    def kv_available(self) -> int:
        return self.read("token_to_kv_pool_allocator.available_size", self.cut.kv_available(), len(self.model.kv_free))

    def mamba_available(self) -> int:
        return self.read("mamba_pool.available_size", self.cut.mamba_available(), len(self.model.mamba_free))

    def req_available(self) -> int:
        return self.read("req_to_token_pool.available_size", self.cut.req_available(), len(self.model.req_free))

    def sizes(self) -> Tuple[int, int, int, int]:
        """(full evictable, full protected, mamba evictable, mamba protected)."""
        return tuple(self.read("tree_cache sizes", got, want) for got, want in zip(self.cut.sizes(), self.model.sizes()))

    # ----- the cache's calls ------------------------------------------------------------------

    @sglang_call("tree_cache.match_prefix")
    def match_prefix(self, request: Request, tokens: Sequence[int], **kwargs: Any) -> int:
        """`tree_cache.match_prefix(key=RadixKey(tokens, request.extra_key), **kwargs)`, its answer
        recorded on `request` as the scheduler records it; returns the matched length. With `req=`
        and `cow_mamba=True` the matched state is copied into the request's Mamba slot."""
        call = f"match_prefix(key={list(tokens)}, {_describe(kwargs)}) for request {request.rid}"
        cut_kwargs = {k: (v.cut if isinstance(v, Request) else v) for k, v in kwargs.items()}
        cow = bool(kwargs.get("cow_mamba")) and kwargs.get("req") is not None
        key = self.cut.key(tokens, request.extra_key)
        match, (kv, last) = self._both(
            call,
            lambda: self.cut.match_prefix(key, **cut_kwargs),
            lambda: self.model.match_for_request(request.model, tuple(tokens), cow),
        )
        self.check_match(call, request.extra_key, tokens, match, kv, last)
        self.remember(match.last_device_node)
        self.cut.adopt_match(request.cut, match)
        request.model.prefix, request.model.last = kv, last
        request.prefix_len = len(kv)
        self.agree(call, f"request {request.rid}'s Mamba slot", self.cut.mamba_slot_of(request.cut), request.model.mamba_slot)
        if cow and last != ROOT:
            request.state_len = len(kv)
            self.check_state(call, request, "after copy-on-write")
        return len(kv)

    def check_match(self, call: str, extra_key: Optional[str], tokens: Sequence[int], match: Any, kv: Tuple[int, ...], last) -> None:
        got = tuple(match.device_indices.tolist())
        self.agree(call, "matched KV slots", got, kv)
        self.agree(call, "dtype of the matched KV slots", match.device_indices.dtype, torch.int64)
        self.same_node(call, "last node", match.last_device_node, last)
        # with no host tier, the host side of a match ends where the device side does
        self.same_node(call, "last host node", match.last_host_node, last)
        if got and self.check_meaning:
            data = self.cut.kv_data()
            wrong = wrong_slot(got, digest.digests(extra_key, tokens[: len(got)]), data)
            if wrong is not None:
                position, slot = wrong
                raise InvariantViolation(
                    "meaning",
                    f"{call}: matched KV slot {slot} (position {position}) holds {self.name_digest(data[slot])}, "
                    f"not that of {list(tokens[: position + 1])}",
                    "matched KV slot",
                )

    @sglang_call("tree_cache.inc_lock_ref")
    def inc_lock_ref(self, req: Request) -> None:
        self.cut.lock_req(req.cut)
        self.model.inc_lock(req.model.last)

    @sglang_call("tree_cache.dec_lock_ref")
    def dec_lock_ref(self, req: Request) -> None:
        self.cut.unlock_req(req.cut)
        self.model.dec_lock(req.model.last)

    @sglang_call("tree_cache.evict")
    def evict(self, num_tokens: int) -> None:
        self.cut.evict(num_tokens)
        self.model.evict(num_tokens)
        self.flush_events()

    @sglang_call("tree_cache.evict_mamba")
    def evict_mamba(self, num: int) -> None:
        self.cut.evict_mamba(num)
        self.model.evict_mamba(num)
        self.flush_events()

    @sglang_call("tree_cache.cache_unfinished_req")
    def cache_unfinished_req(self, req: Request, **kwargs: Any) -> None:
        call = f"cache_unfinished_req(req {req.rid}, {_describe(kwargs)})"
        self._both(call, lambda: self.cut.cache_unfinished_req(req.cut, **kwargs), lambda: self.model.cache_unfinished_req(req.model))
        self.agree(call, "the request's prefix after caching", tuple(self.cut.prefix_of(req.cut)), req.model.prefix)
        self.same_node(call, "the request's last node after caching", self.cut.last_node_of(req.cut), req.model.last)
        req.prefix_len = len(req.model.prefix)

    @sglang_call("tree_cache.cache_finished_req")
    def cache_finished_req(self, req: Request, **kwargs: Any) -> None:
        """The request's tokens go into the tree (unless `is_insert=False`), its lock is
        released and, where the release frees it here, its request slot."""
        call = f"cache_finished_req(req {req.rid}, {_describe(kwargs)})"
        self._both(
            call,
            lambda: self.cut.cache_finished_req(req.cut, **kwargs),
            lambda: self.model.cache_finished_req(req.model, is_insert=kwargs.get("is_insert", True)),
        )
        req.released = True

    @sglang_call("tree_cache.reset")
    def reset(self) -> None:
        self.cut.reset()
        self.model.reset()

    # ----- the pools' calls -------------------------------------------------------------------

    @sglang_call("token_to_kv_pool_allocator.alloc")
    def kv_alloc(self, n: int) -> Optional[List[int]]:
        return self._handed_out(f"token_to_kv_pool_allocator.alloc({n})", self.cut.kv_alloc(n), self.model.kv_alloc(n))

    def _handed_out(self, call: str, got: Optional[torch.Tensor], want: Optional[List[int]]) -> Optional[List[int]]:
        """The slots a pool's `alloc` handed out: the model's, as int64."""
        got_list = None if got is None else got.tolist()
        self.agree(call, "the slots handed out", got_list, want)
        if got is not None:
            self.agree(call, "dtype of the slots", got.dtype, torch.int64)
        return got_list

    @sglang_call("token_to_kv_pool_allocator.free_group_begin")
    def free_group_begin(self) -> None:
        self.cut.free_group_begin()
        self.model.free_group_begin()

    @sglang_call("token_to_kv_pool_allocator.free_group_end")
    def free_group_end(self) -> None:
        self.cut.free_group_end()
        self.model.free_group_end()

    @sglang_call("token_to_kv_pool_allocator.clear")
    def kv_clear(self) -> None:
        self.cut.kv_clear()
        self.model.kv_clear()

    @sglang_call("req_to_token_pool.alloc")
    def req_alloc(self, reqs: Sequence[Request]) -> Optional[List[int]]:
        """The request pool's `alloc(len(reqs), reqs)`: a request slot each, and a Mamba slot
        for each request without one. Each slot's row is overwritten, as its new occupant will
        (whatever kept a view of it sees that)."""
        call = f"req_to_token_pool.alloc({len(reqs)}, reqs {[r.rid for r in reqs]})"
        fresh = [r for r in reqs if r.model.req_slot is None]  # a request holding a row keeps it
        got = self.cut.req_alloc([r.cut for r in reqs])
        want = self.model.req_alloc([r.model for r in reqs])
        self.agree(call, "the request slots handed out", got, want)
        for r in reqs:
            self.agree(call, f"request {r.rid}'s Mamba slot", self.cut.mamba_slot_of(r.cut), r.model.mamba_slot)
        if got is not None:
            for r in fresh:
                self._overwrite(*self.cut.row_views(r.model.req_slot))
        return got

    @sglang_call("req_to_token_pool.free")
    def req_free(self, req: Request, **kwargs: Any) -> None:
        """The request pool's `free(req.req_pool_idx, **kwargs)`."""
        self.cut.req_free(req.cut, **kwargs)
        self.model.req_free_slot(req.model, free_mamba=kwargs.get("free_mamba_cache", True))

    def give_mamba_slot(self, req: Request, slot: int) -> None:
        """The request takes Mamba slot `slot` (allocated by its caller) as its own."""
        self.cut.give_mamba_slot(req.cut, self.cut.indices([slot])[0])
        req.model.mamba_slot = slot

    @sglang_call("mamba_pool.free")
    def mamba_free(self, req: Request) -> None:
        """The Mamba pool's `free(req.mamba_pool_idx.unsqueeze(-1))`; the request lets go of it."""
        self.cut.free_req_mamba(req.cut)
        self.model.free_mamba([req.model.mamba_slot])
        req.model.mamba_slot = None
        req.state_len = None

    @sglang_call("req_to_token_pool.clear")
    def req_pool_clear(self) -> None:
        self.cut.req_pool_clear()
        self.model.req_pool_clear()

    @sglang_call("req_to_token_pool.write")
    def write_row(self, req: Request, start: int, slots: Sequence[int]) -> None:
        """`req_to_token[req's slot, start:start + len(slots)] = slots`."""
        if slots:
            self.cut.write_row(req.cut, start, self.cut.indices(slots))
            for offset, slot in enumerate(slots):
                req.model.row[start + offset] = slot

    @sglang_call("tree_cache.sanity_check")
    def sanity_check(self) -> None:
        """The cache's own self-check (the model has none: its structure is its rules)."""
        self.cut.sanity_check()

    # ----- the stand-in forward pass ----------------------------------------------------------

    def check_state(self, call: str, req: Request, when: str) -> None:
        """The request's Mamba state holds the digest of tokens()[:state_len]."""
        if not self.check_meaning:
            return
        slot = self.cut.mamba_slot_of(req.cut)
        want = digest.digest(req.extra_key, req.tokens()[: req.state_len])
        got = self.cut.state_digests()[slot]
        if got != want:
            raise InvariantViolation(
                "meaning",
                f"{call}: request {req.rid}'s Mamba slot {slot} {when} holds {self.name_digest(got)}, "
                f"not that of its {req.state_len}-token prefix {list(req.tokens()[: req.state_len])}",
                f"request's Mamba state {when}",
            )

    @sglang_call("forward pass")
    def forward(self, req: Request, start: int, end: int) -> None:
        """Compute positions start..end-1 of the request: their KV slots (already in its row)
        get the digests of their prefixes, its Mamba state that of tokens()[:end]. A state
        resumed from (start > 0) must be that of tokens()[:start]. With nothing to compute
        (end <= start) the state stays as it is."""
        tokens = req.tokens()
        if start > 0 and self.check_meaning:
            if req.state_len != start:
                raise InvariantViolation(
                    "meaning",
                    f"forward pass of request {req.rid}: it resumes after {start} tokens, but its Mamba state "
                    f"was computed for {req.state_len} tokens",
                    "resumed state's length",
                )
            self.check_state(f"forward pass of request {req.rid}", req, "before resuming")
        if end <= start:
            return
        values = self.record_digests(req.extra_key, tokens[:end], start)
        row = self.cut.req_rows(end)[self.cut.req_slot_of(req.cut)]
        self.cut.write_kv(row[start:end], values[start:end])
        self.cut.write_state(self.cut.mamba_slot_of(req.cut), values[end - 1])
        req.state_len = end

    # ----- a direct user of the cache's API ---------------------------------------------------

    @sglang_call("tree_cache.match_prefix")
    def match(self, tokens: Sequence[int], extra_key: Optional[str]) -> Tuple[Any, Any]:
        """A plain `match_prefix(key)` (no request, no copy-on-write); returns the cache's last
        node and the model's path for it."""
        call = f"match_prefix({list(tokens)}, extra_key={extra_key!r})"
        match = self.cut.match_prefix(self.cut.key(tokens, extra_key))
        kv, last = self.model.match_prefix(tuple(tokens), extra_key)
        self.flush_events()
        self.check_match(call, extra_key, tokens, match, kv, last)
        self.remember(match.last_device_node)
        return match.last_device_node, last

    @sglang_call("tree_cache.inc_lock_ref")
    def lock_node(self, node: Any, path) -> None:
        self.cut.inc_lock_ref(node)
        self.model.inc_lock(path)

    @sglang_call("tree_cache.dec_lock_ref")
    def unlock_node(self, node: Any, path) -> None:
        self.cut.dec_lock_ref(node)
        self.model.dec_lock(path)

    @sglang_call("tree_cache.insert")
    def insert(self, tokens: Sequence[int], extra_key: Optional[str], kv: List[int], mamba: int) -> Tuple[int, bool]:
        """A direct `insert(key, kv, mamba)` of slots the caller allocated and computed; the
        caller's index tensors are overwritten once the call returns (a tree that kept them
        would change). Returns `(prefix_len, mamba_exist)`."""
        call = f"insert({list(tokens)}, extra_key={extra_key!r})"
        kv_index, mamba_index = self.cut.indices(kv), self.cut.indices([mamba])
        got = self.cut.insert(self.cut.key(tokens, extra_key), kv_index, mamba_index)
        self._overwrite(kv_index, mamba_index)
        want = self.model.insert(tuple(tokens), extra_key, tuple(kv), mamba)
        self.flush_events()
        self.agree(call, "(prefix_len, mamba_exist)", tuple(got), want)
        return want

    @sglang_call("token_to_kv_pool_allocator.free")
    def free_kv_slots(self, slots: Sequence[int]) -> None:
        """A caller returns KV slots it owns; its index tensor is overwritten afterwards."""
        if slots:
            index = self.cut.indices(slots)
            self.cut.kv_free(index)
            self._overwrite(index)
            self.model.free_kv(list(slots))

    @sglang_call("mamba_pool.free")
    def free_mamba_slot(self, slot: int) -> None:
        index = self.cut.indices([slot])
        self.cut.mamba_free(index)
        self._overwrite(index)
        self.model.free_mamba([slot])

    @sglang_call("mamba_pool.alloc")
    def mamba_alloc(self, n: int) -> Optional[List[int]]:
        return self._handed_out(f"mamba_pool.alloc({n})", self.cut.mamba_alloc(n), self.model.mamba_alloc(n))

    def compute(self, extra_key: Optional[str], tokens: Sequence[int], kv: Sequence[int], mamba: int) -> None:
        """What a forward pass over `tokens` from nothing writes: their KV slots and a state."""
        values = self.record_digests(extra_key, tuple(tokens), 0)
        self.cut.write_kv(kv, values)
        self.cut.write_state(mamba, values[-1])

    def refused(self, call: str, what: str, attempt: Callable[[], Any]) -> None:
        """The misuse `attempt` must raise the cache's misuse error and change nothing."""
        before = self.cut.snapshot()
        try:
            attempt()
        except self.cut.misuse_error:
            self.on_event("misuse refused")
        else:
            raise Divergence(call, what, "accepted", "refused")
        after = self.cut.snapshot()
        self.agree(call, "state after the refused call", _comparable(after), _comparable(before))


def _comparable(snap) -> tuple:
    """A snapshot without what differs between two reads of the same state (weak references)."""
    return snap._replace(node_refs=None)
