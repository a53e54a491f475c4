"""Adapters: how the harness builds, drives and reads a cache under test.

`ImplAdapter` wraps this repository's `impl`. An adapter builds the pools and cache from a
`CacheConfig`, makes requests and keys, maps nodes to paths, and reads a `Snapshot` straight off
the implementation's nodes, list links, counters and pools.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

import impl
from harness.config import CacheConfig
from harness.invariants import InvariantViolation
from harness.snapshot import NodeView, Path, Snapshot
from reference import SGLANG_0_5_4, Rules

ROOT_PATH: Path = (None, ())


class CacheAdapter:
    """What the driver and the checks need from one cache under test and its three pools.

    Subclasses build `cache`, `kv`, `req_pool`, `mamba_pool` (the Mamba states) and `mamba_slots`
    (what hands out Mamba slots: the pool itself up to SGLang 0.5.4) from a `CacheConfig`, and
    say how to read their LRU lists and how the harness writes and reads KV and Mamba data. The
    cache and pool calls the driver makes go through the methods below, written for SGLang
    0.5.4's API (which `impl` shares); an adapter for another API translates them, and names
    in `rules` the release behaviour the reference model follows for it.
    """

    name = "abstract"
    misuse_error: type = Exception  # raised when the cache refuses a misuse (e.g. a bad unlock)
    mamba_exhausted_error: type = Exception  # raised when no Mamba slot is left even after evicting
    # whether the request pool's alloc returns None (changing nothing) when the Mamba pool is
    # short; where it cannot (SGLang asserts), the driver does not admit such a request
    req_alloc_fails_gracefully: bool = True
    # whether lock calls on a node no longer in the tree are refused (impl checks; SGLang does
    # not, and its scheduler never makes them), so the driver may try that misuse
    refuses_detached_nodes: bool = False

    rules: Rules = SGLANG_0_5_4

    config: CacheConfig
    device: torch.device
    cache: Any
    kv: Any
    req_pool: Any
    mamba_pool: Any
    mamba_slots: Any

    def version(self) -> str:
        raise NotImplementedError

    def is_mamba_exhausted(self, exc: BaseException) -> bool:
        """Whether `exc` (a `mamba_exhausted_error`) says the Mamba pool ran out."""
        return True

    # ----- requests, keys, indices ------------------------------------------------------------

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return impl.Req(rid, list(tokens), extra_key)

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Any:
        raise NotImplementedError

    def indices(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.device)

    def mamba_slot_of(self, req: Any) -> Optional[int]:
        return None if req.mamba_pool_idx is None else int(req.mamba_pool_idx)

    # ----- the cache and pool calls the driver makes -------------------------------------------

    def match_prefix(self, key: Any, req: Any = None) -> Any:
        """`match_prefix(key)`; with `req`, copy-on-write the matched state into its Mamba slot."""
        if req is None:
            return self.cache.match_prefix(key)
        return self.cache.match_prefix(key, cow_mamba=True, req=req)

    def adopt_match(self, req: Any, match: Any) -> None:
        """Record a match on the request, as the scheduler does before it locks the node."""
        req.prefix_indices = match.device_indices
        req.last_node = match.last_device_node

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        """Raw insert; returns (prefix_len, mamba_exist)."""
        prefix_len, exist = self.cache.insert(key, kv, mamba)
        return prefix_len, exist

    def cache_unfinished_req(self, req: Any, chunked: bool) -> None:
        self.cache.cache_unfinished_req(req, chunked=chunked)

    def cache_finished_req(self, req: Any) -> None:
        """Cache a finished request; its request slot is released with it."""
        self.cache.cache_finished_req(req)

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(num_tokens)

    def evict_mamba(self, num: int) -> None:
        self.cache.evict_mamba(num)

    def inc_lock_ref(self, node: Any) -> None:
        self.cache.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any) -> None:
        self.cache.dec_lock_ref(node)

    def alloc_req_slot(self, req: Any) -> Optional[int]:
        """A request slot for `req` (and a Mamba slot if it has none), or None."""
        got = self.req_pool.alloc(1, [req])
        if got is None:
            return None
        req.req_pool_idx = got[0]
        return got[0]

    def free_req_slot(self, req: Any, free_mamba: bool) -> None:
        """Give back the request's slot, and its Mamba slot with it if `free_mamba`."""
        self.req_pool.free(req.req_pool_idx, free_mamba_cache=free_mamba)
        req.req_pool_idx = None

    # ----- the data the harness writes (a stand-in for forward passes) ------------------------

    def write_kv(self, slots: Sequence[int], tokens: Sequence[int]) -> None:
        """Store each token id as the KV data of its slot."""
        raise NotImplementedError

    def read_kv(self, indices: torch.Tensor) -> List[int]:
        """The token id stored as the KV data of each slot of `indices`."""
        raise NotImplementedError

    def kv_payload(self) -> List[int]:
        """The token id stored in every KV slot 0..size."""
        raise NotImplementedError

    def mamba_tensors(self) -> List[torch.Tensor]:
        """The Mamba pool's state tensors, each indexed [layer, slot, ...], the one kept in the
        widest dtype first."""
        cache = self.mamba_pool.mamba_cache
        return [cache.temporal, cache.conv]

    def fill_mamba(self, slot: int, value: float) -> None:
        """Set every element of Mamba slot `slot`'s states to `value`."""
        index = self.indices([slot])
        for state in self.mamba_tensors():
            state.index_fill_(1, index, value)

    def mamba_states(self) -> List[Optional[float]]:
        """Per Mamba slot (0 up to the model's last): its state value if every element of every
        state tensor agrees, else None.

        A state kept in a narrower dtype than the value (SGLang keeps conv in bfloat16) agrees
        when it holds the value rounded to its dtype."""
        end = self.rules.first_mamba_slot + self.config.mamba_size
        # one transfer per state tensor, as nested lists [layer][slot][element]; the comparing
        # is done on the host, per slot
        readings = [(s.dtype, s.flatten(2).tolist()) for s in self.mamba_tensors()]
        first_dtype, first_layers = readings[0]
        values = [first_layers[0][slot][0] for slot in range(end)]
        as_stored = {first_dtype: values}
        for dtype, _ in readings:
            if dtype not in as_stored:
                as_stored[dtype] = torch.tensor(values, dtype=first_dtype, device="cpu").to(dtype).float().tolist()
        agrees = [True] * end
        for dtype, layers in readings:
            wants = as_stored[dtype]
            for layer in layers:
                agrees = [ok and row.count(want) == len(row) for ok, row, want in zip(agrees, layer, wants)]
        return [value if ok else None for value, ok in zip(values, agrees)]

    def req_rows(self, length: int) -> List[List[int]]:
        """The first `length` KV slots of every request slot's req_to_token row, in one transfer."""
        return self.req_pool.req_to_token[:, :length].tolist()

    # ----- reading the tree -------------------------------------------------------------------

    def path_of(self, node: Any) -> Path:
        """The (extra_key, tokens from the root) name of a node (None for no node)."""
        if node is None:
            return None
        segments = []
        extra = None
        while node is not self.cache.root_node:
            segments.append(node.key.token_ids)
            extra = node.key.extra_key
            node = node.parent
        return (extra, tuple(t for seg in reversed(segments) for t in seg)) if segments else ROOT_PATH

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        """The "full" or "mamba" LRU list as its links give it, in one walk: its members, most
        recently used first, and whether its prev/next links agree both ways, end at the list's
        ends and count its size (and any order stamps hold). The walk is the harness's own; it
        never asks the list whether it is consistent."""
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        cache = self.cache
        root = cache.root_node
        walked = []  # (node, its path, its parent's path) in the order the walk meets them
        path_by_id: Dict[int, Path] = {}
        stack = [(root, ROOT_PATH)]
        while stack:
            node, path = stack.pop()
            parent = None if node is root else path
            for child in node.children.values():
                key = child.key
                child_path = (key.extra_key, path[1] + tuple(key.token_ids))
                if child.value.dtype != torch.int64:
                    raise InvariantViolation(
                        "trees_equal", f"node {child_path}: KV slots stored as {child.value.dtype}, not torch.int64"
                    )
                walked.append((child, child_path, parent))
                path_by_id[id(child)] = child_path
                stack.append((child, child_path))
        # every node's KV slots, then every holder's Mamba slot, read with one transfer, not
        # one per node
        kv_tensors = [n.value for n, _, _ in walked]
        holders = [n.mamba_value for n, _, _ in walked if n.mamba_value is not None]
        slots = torch.cat(kv_tensors + holders).tolist() if walked else []
        mamba_slots = iter(slots[len(slots) - len(holders) :])
        nodes: Dict[Path, NodeView] = {}
        start = 0
        for (node, path, parent), kv in zip(walked, kv_tensors):
            end = start + kv.shape[0]
            nodes[path] = NodeView(
                path,
                parent,
                tuple(slots[start:end]),
                None if node.mamba_value is None else next(mamba_slots),
                node.full_lock_ref,
                node.mamba_lock_ref,
                len(node.children),
            )
            start = end

        full_members, full_links_ok = self.read_lru("full")
        mamba_members, mamba_links_ok = self.read_lru("mamba")

        def paths(members: List[Any]) -> List[Path]:
            return [path_by_id.get(id(n), ("<not in tree>", (n.id,))) for n in members]

        return Snapshot(
            nodes=nodes,
            full_lru=paths(full_members),
            mamba_lru=paths(mamba_members),
            full_links_ok=full_links_ok,
            mamba_links_ok=mamba_links_ok,
            sizes=(
                cache.full_evictable_size(),
                cache.full_protected_size(),
                cache.mamba_evictable_size(),
                cache.mamba_protected_size(),
            ),
            root_locks=(cache.root_node.full_lock_ref, cache.root_node.mamba_lock_ref),
            kv_free=self._kv_free(),
            mamba_free=self.mamba_slots.free_slots.tolist(),
            req_free=list(self.req_pool.free_slots),
        )

    def _kv_free(self) -> List[int]:
        """The free KV slots in hand-out order: `free_pages`, then any not yet merged back."""
        free, released = self.kv.free_pages, self.kv.release_pages
        return (torch.cat((free, released)) if released.numel() else free).tolist()

    def format_tree(self) -> str:
        """The tree, one node per line, indented by depth."""
        lines = []
        stack = [(child, 0) for child in reversed(list(self.cache.root_node.children.values()))]
        while stack:
            node, depth = stack.pop()
            state = "tombstone" if node.mamba_value is None else f"mamba={int(node.mamba_value[0])}"
            lines.append(
                f"{'  ' * depth}{list(node.key.token_ids)} kv={node.value.tolist()} {state} "
                f"locks={node.full_lock_ref}/{node.mamba_lock_ref}"
            )
            stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))
        return "\n".join(lines) or "(empty tree)"


class ImplAdapter(CacheAdapter):
    """The harness's handle on `impl` (or a subclass of its cache, for planted bugs)."""

    name = "impl"
    misuse_error = impl.CacheMisuseError
    refuses_detached_nodes = True
    mamba_exhausted_error = impl.MambaPoolExhaustedError

    def __init__(self, config: CacheConfig, cache_class: Callable[..., Any] = impl.MambaRadixCache):
        self.config = config
        self.kv = impl.TokenToKVPoolAllocator(config.kv_size, device=config.device, debug=True)
        self.req_pool = impl.HybridReqToTokenPool(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            debug=True,
        )
        self.mamba_pool = self.mamba_slots = self.req_pool.mamba_pool
        self.cache = cache_class(self.req_pool, self.kv, page_size=config.page_size)
        self.device = torch.device(config.device)

    def version(self) -> str:
        return impl.__version__

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> impl.RadixKey:
        return impl.RadixKey(list(tokens), extra_key)

    def write_kv(self, slots: Sequence[int], tokens: Sequence[int]) -> None:
        self.kv.write_payload(self.indices(slots), self.indices(tokens))

    def read_kv(self, indices: torch.Tensor) -> List[int]:
        return self.kv.read_payload(indices)[:, 0].tolist()

    def kv_payload(self) -> List[int]:
        return self.kv.payload[:, 0].tolist()

    def fill_mamba(self, slot: int, value: float) -> None:
        self.mamba_pool.fill(self.indices([slot]), value)

    def mamba_tensors(self) -> List[torch.Tensor]:
        return [self.mamba_pool.states]  # conv and temporal are views of it: one read for both

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        lru = self._lru(which)
        head, tail, size = lru._head, lru._tail, len(lru)
        members: List[Any] = []
        link = head
        while link.next is not tail:
            following = link.next
            if (
                following is None
                or following.prev is not link
                or (link is not head and following.tick >= link.tick)  # ticks fall towards the tail
                or len(members) == size  # more members than the list counts (or a cycle)
            ):
                return members, False
            members.append(following.node)
            link = following
        return members, tail.prev is link and len(members) == size

    def format_tree(self) -> str:
        return self.cache.format_tree()

    def _lru(self, which: str):
        return self.cache.full_lru_list if which == "full" else self.cache.mamba_lru_list


def adapter_for(impl_name: str) -> Callable[[CacheConfig], Any]:
    """`impl` (this repository's cache), `sglang` (SGLang's, when installed) or `MODULE:CLASS`,
    a subclass of `impl`'s `MambaRadixCache`.

    Raises `ValueError` naming the argument when it cannot be loaded.
    """
    if impl_name == "impl":
        return ImplAdapter
    if impl_name == "sglang":
        from harness.sglang_adapter import adapter_class, sglang_unavailable

        reason = sglang_unavailable()
        if reason:
            raise ValueError(f"--impl sglang: {reason}")
        return adapter_class()
    module_name, _, class_name = impl_name.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--impl must be 'impl', 'sglang' or MODULE:CLASS, got {impl_name!r}")
    try:
        cache_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--impl {impl_name}: cannot load it ({exc})") from None
    return functools.partial(ImplAdapter, cache_class=cache_class)
