"""`ParityCache`: SGLang's `UnifiedRadixCache` on its Python and its Rust tree core, side by side.

The two cores are meant to agree (SGLang keeps the Python core beside the Rust one, which
serving uses by default). Each cache call and pool call the harness makes is made on both, each
with its own pools and its own `Req`; the run fails (`core_parity`) at the first difference in a
return value (node ids aside: the cores number nodes differently, so a node is compared by its
KV slots from the root), in whether a call raised and with what, or in what can be read of both
from outside after the call: the four sizes, the three free lists, the slots each tree holds,
the request rows and the data in the pools. The harness reads the Python core white-box for its
own checks, so a parity run checks the Python core against the model and the Rust core against
the Python core.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from harness.caches.base import CacheUnderTest
from harness.checks.violation import InvariantViolation
from harness.snapshot import Snapshot
from strategies.config import CacheConfig


class ReqPair(NamedTuple):
    """One request as each core's scheduler holds it."""

    py: Any
    rs: Any


class ParityMatch(NamedTuple):
    """A match on both cores; the harness reads the Python core's."""

    device_indices: torch.Tensor
    last_device_node: int
    last_host_node: int
    rust: Any


class ParityCache(CacheUnderTest):
    """Both tree cores of one release, every call made on both and compared (see the module
    docstring)."""

    name = "sglang-parity"

    def __init__(self, config: CacheConfig, tree_core: str = "parity", cache_class: Callable[..., Any] = None):
        self.python = cache_class(config, tree_core="python")
        self.rust = cache_class(config, tree_core="rust")
        py = self.python
        self.sgl, self.release, self.config, self.device = py.sgl, py.release, config, py.device
        self.rules, self.default_protocol = py.rules, py.default_protocol
        self.misuse_error, self.mamba_exhausted_error = py.misuse_error, py.mamba_exhausted_error
        self.cache, self.kv, self.req_pool, self.mamba_pool, self.mamba_slots = py.cache, py.kv, py.req_pool, py.mamba_pool, py.mamba_slots

    # ----- making a call on both --------------------------------------------------------------

    def _differ(self, call: str, what: str, py_value: Any, rs_value: Any) -> None:
        raise InvariantViolation(
            "core_parity",
            f"{call}: {what} differs between the tree cores: Python gave {py_value!r}, Rust {rs_value!r}",
            f"{call.split('(')[0]}: {what}",
        )

    def _both(self, call: str, method: str, *args: Any, **kwargs: Any) -> Tuple[Any, Any]:
        """`method` on both cores, each with its own half of the arguments; an exception must be
        raised by both, with the same type and message (then the Python core's propagates)."""
        got = []
        for side, core in (("py", self.python), ("rs", self.rust)):
            own_args = [_side(a, side) for a in args]
            own_kwargs = {k: _side(v, side) for k, v in kwargs.items()}
            try:
                got.append((getattr(core, method)(*own_args, **own_kwargs), None))
            except Exception as exc:  # noqa: BLE001 (compared, then re-raised)
                got.append((None, exc))
        (py_value, py_exc), (rs_value, rs_exc) = got
        if (py_exc is None) != (rs_exc is None) or (
            py_exc is not None and (type(py_exc), str(py_exc)) != (type(rs_exc), str(rs_exc))
        ):
            self._differ(call, "whether it raised", _raised(py_exc), _raised(rs_exc))
        if py_exc is not None:
            raise py_exc
        return py_value, rs_value

    def _same(self, call: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` on both cores; their answers must be equal. Returns the Python core's."""
        py_value, rs_value = self._both(call, method, *args, **kwargs)
        if _plain(py_value) != _plain(rs_value):
            self._differ(call, "the answer", _plain(py_value), _plain(rs_value))
        return py_value

    def _mutate(self, call: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """A call that changes the cache or the pools: the answers and then everything
        observable from outside must agree."""
        value = self._same(call, method, *args, **kwargs)
        self._observe(call)
        return value

    def _observe(self, call: str) -> None:
        for what, read in (
            ("sizes (full evictable, full protected, mamba evictable, mamba protected)", lambda c: c.sizes()),
            ("KV free list", lambda c: c.kv_free_slots()),
            ("Mamba free list", lambda c: c.mamba_free_slots()),
            ("request free list", lambda c: c.req_free_slots()),
            ("KV slots the tree holds", lambda c: sorted(c.cache.all_values_flatten().tolist())),
            ("Mamba slots the tree holds", lambda c: sorted(c.cache.all_mamba_values_flatten().reshape(-1).tolist())),
        ):
            py_value, rs_value = read(self.python), read(self.rust)
            if py_value != rs_value:
                self._differ(f"after {call}", what, py_value, rs_value)

    # ----- requests ---------------------------------------------------------------------------

    def is_mamba_exhausted(self, exc: BaseException) -> bool:
        return self.python.is_mamba_exhausted(exc)

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> ReqPair:
        return ReqPair(self.python.new_req(rid, tokens, extra_key), self.rust.new_req(rid, tokens, extra_key))

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Tuple[Tuple[int, ...], Hashable]:
        return tuple(tokens), extra_key

    def set_fill(self, req: ReqPair, tokens: Sequence[int]) -> None:
        self._both("set_fill", "set_fill", req, tokens)

    def append_output(self, req: ReqPair, token: int) -> None:
        self._both("append_output", "append_output", req, token)

    def adopt_match(self, req: ReqPair, match: ParityMatch) -> None:
        self.python.adopt_match(req.py, match)
        self.rust.adopt_match(req.rs, match.rust)

    def reset_for_retract(self, req: ReqPair) -> None:
        self._both("reset_for_retract", "reset_for_retract", req)

    def forget_req_slot(self, req: ReqPair) -> None:
        self._both("forget_req_slot", "forget_req_slot", req)

    def req_slot_of(self, req: ReqPair) -> Optional[int]:
        return self._same("the request slot", "req_slot_of", req)

    def mamba_slot_of(self, req: ReqPair) -> Optional[int]:
        return self._same("the request's Mamba slot", "mamba_slot_of", req)

    def prefix_of(self, req: ReqPair) -> List[int]:
        return self._same("the request's prefix", "prefix_of", req)

    def last_node_of(self, req: ReqPair) -> Any:
        """The Python core's node; while it is in the tree, the Rust core's must be the same
        node (the same KV slots from the root). A finished request's node may have left both."""
        py_node, rs_node = req.py.last_node, req.rs.last_node
        if (py_node is None) != (rs_node is None):
            self._differ("the request's last node", "whether there is one", py_node, rs_node)
        if py_node is not None and self.python.node_object(py_node) is not None:
            py_kv = self.python.node_kv(py_node)
            try:
                rs_kv = self.rust.node_kv(rs_node)
            except Exception as exc:  # noqa: BLE001 (the Rust core lost a node the Python core has)
                rs_kv = _raised(exc)
            if py_kv != rs_kv:
                self._differ("the request's last node", "its KV slots from the root", py_kv, rs_kv)
        return py_node

    # ----- the cache's own calls --------------------------------------------------------------

    def match_prefix(self, key: Tuple[Tuple[int, ...], Hashable], **kwargs: Any) -> ParityMatch:
        tokens, extra_key = key
        call = f"match_prefix({list(tokens)})"
        py_match, rs_match = self._both(
            call, "match_prefix", _Pair(self.python.key(tokens, extra_key), self.rust.key(tokens, extra_key)), **kwargs
        )
        for what, py_value, rs_value in (
            ("matched KV slots", py_match.device_indices.tolist(), rs_match.device_indices.tolist()),
            ("last node (its KV slots from the root)", self.python.node_kv(py_match.last_device_node), self.rust.node_kv(rs_match.last_device_node)),
            ("last host node (its KV slots from the root)", self.python.node_kv(py_match.last_host_node), self.rust.node_kv(rs_match.last_host_node)),
        ):
            if py_value != rs_value:
                self._differ(call, what, py_value, rs_value)
        self._observe(call)
        return ParityMatch(py_match.device_indices, py_match.last_device_node, py_match.last_host_node, rs_match)

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        tokens, extra_key = key
        pair = _Pair(self.python.key(tokens, extra_key), self.rust.key(tokens, extra_key))
        return self._mutate(f"insert({list(tokens)})", "insert", pair, _Pair(kv, kv.clone()), _Pair(mamba, mamba.clone()))

    def cache_unfinished_req(self, req: ReqPair, **kwargs: Any) -> None:
        self._mutate("cache_unfinished_req", "cache_unfinished_req", req, **kwargs)

    def cache_finished_req(self, req: ReqPair, **kwargs: Any) -> None:
        self._mutate("cache_finished_req", "cache_finished_req", req, **kwargs)

    def evict(self, num_tokens: int) -> None:
        self._mutate(f"evict({num_tokens})", "evict", num_tokens)

    def evict_mamba(self, num: int) -> None:
        self._mutate(f"evict_mamba({num})", "evict_mamba", num)

    def lock_req(self, req: ReqPair) -> None:
        self._mutate("lock", "lock_req", req)

    def unlock_req(self, req: ReqPair) -> None:
        self._mutate("unlock", "unlock_req", req)

    def reset(self) -> None:
        self._mutate("reset", "reset")

    def sanity_check(self) -> None:
        self._both("sanity_check", "sanity_check")

    def sizes(self) -> Tuple[int, int, int, int]:
        return self._same("sizes", "sizes")

    # ----- the pools' calls -------------------------------------------------------------------

    def kv_available(self) -> int:
        return self._same("token_to_kv_pool_allocator.available_size", "kv_available")

    def kv_alloc(self, n: int) -> Optional[torch.Tensor]:
        return self._mutate(f"token_to_kv_pool_allocator.alloc({n})", "kv_alloc", n)

    def kv_free(self, index: torch.Tensor) -> None:
        self._mutate("token_to_kv_pool_allocator.free", "kv_free", _Pair(index, index.clone()))

    def free_group_begin(self) -> None:
        self._both("free_group_begin", "free_group_begin")

    def free_group_end(self) -> None:
        self._mutate("free_group_end", "free_group_end")

    def kv_clear(self) -> None:
        self._mutate("token_to_kv_pool_allocator.clear", "kv_clear")

    def mamba_available(self) -> int:
        return self._same("mamba available_size", "mamba_available")

    def mamba_alloc(self, n: int) -> Optional[torch.Tensor]:
        return self._mutate(f"mamba alloc({n})", "mamba_alloc", n)

    def mamba_free(self, index: torch.Tensor) -> None:
        self._mutate("mamba free", "mamba_free", _Pair(index, index.clone()))

    def give_mamba_slot(self, req: ReqPair, slot: torch.Tensor) -> None:
        self._both("give_mamba_slot", "give_mamba_slot", req, _Pair(slot, slot.clone()))

    def free_req_mamba(self, req: ReqPair) -> None:
        self._mutate("free the request's Mamba slot", "free_req_mamba", req)

    def req_available(self) -> int:
        return self._same("req_to_token_pool.available_size", "req_available")

    def req_alloc(self, reqs: Sequence[ReqPair]) -> Optional[List[int]]:
        return self._mutate("req_to_token_pool.alloc", "req_alloc", _Pair([r.py for r in reqs], [r.rs for r in reqs]))

    def req_free(self, req: ReqPair, **kwargs: Any) -> None:
        self._mutate("req_to_token_pool.free", "req_free", req, **kwargs)

    def req_pool_clear(self) -> None:
        self._mutate("req_to_token_pool.clear", "req_pool_clear")

    def write_row(self, req: ReqPair, start: int, slots: torch.Tensor) -> None:
        self._both("write the request's row", "write_row", req, start, _Pair(slots, slots.clone()))

    def req_rows(self, length: int) -> List[List[int]]:
        return self._same("the request rows", "req_rows", length)

    def request_rows(self) -> torch.Tensor:
        return self.python.request_rows()

    def row_views(self, slot: int) -> List[torch.Tensor]:
        return self.python.row_views(slot) + self.rust.row_views(slot)

    # ----- the data the harness's forward pass writes ------------------------------------------

    def write_kv(self, slots: Sequence[int], values: Sequence[int]) -> None:
        self._both("write KV", "write_kv", slots, values)

    def kv_data(self) -> List[int]:
        return self._same("the KV data", "kv_data")

    def write_state(self, slot: int, value: int) -> None:
        self._both("write a Mamba state", "write_state", slot, value)

    def state_digests(self) -> List[Optional[int]]:
        return self._same("the Mamba states", "state_digests")

    # ----- reading the tree (the Python core's) ------------------------------------------------

    def free_list_tensors(self) -> List[torch.Tensor]:
        return self.python.free_list_tensors()

    def kv_free_slots(self) -> List[int]:
        return self.python.kv_free_slots()

    def mamba_free_slots(self) -> List[int]:
        return self.python.mamba_free_slots()

    def req_free_slots(self) -> List[int]:
        return self.python.req_free_slots()

    def node_kv(self, node: Any) -> Tuple[int, ...]:
        return self.python.node_kv(node)

    def node_object(self, node: Any) -> Any:
        return self.python.node_object(node)

    def path_of(self, node: Any):
        return self.python.path_of(node)

    def in_tree(self, node: Any) -> bool:
        return self.python.in_tree(node)

    def snapshot(self) -> Snapshot:
        return self.python.snapshot()

    def format_tree(self) -> str:
        return self.python.format_tree()


class _Pair(NamedTuple):
    """An argument with a value of its own for each core."""

    py: Any
    rs: Any


def _side(value: Any, side: str) -> Any:
    return getattr(value, side) if isinstance(value, (ReqPair, _Pair)) else value


def _plain(value: Any) -> Any:
    """A value as compared between the cores (tensors as lists)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def _raised(exc: Optional[BaseException]) -> str:
    return "no exception" if exc is None else f"{type(exc).__name__}: {exc}"
