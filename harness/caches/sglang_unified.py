"""`SglangUnifiedCache`: SGLang's `UnifiedRadixCache` with Full + Mamba components, the cache its
scheduler builds for hybrid Mamba models (0.5.20's `mem_cache/registry.py`,
`_create_unified_radix_cache`; the only hybrid cache from 0.5.21 on), as a cache under test.

The pools and the cache are built as the scheduler's build context builds them (the
configuration's page size and Mamba strategy, no host tier): `HybridReqToTokenPool`, a
`TokenToKVPoolAllocator` (paged past page size 1) with no KV tensors (`kvcache=None`), and `UnifiedRadixCache(CacheInitParams(tree_components=(FULL,
MAMBA)))` on the tree core named by `tree_core` (`python` or `rust`, what
`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` picks in serving). Requests are SGLang's own `Req`.

The calls differ by era, and each era's module makes them as its release's scheduler helpers
do: `sglang_unified_0_5_22` (0.5.22 on), `sglang_unified_0_5_20` (0.5.19 .. 0.5.21) and the eras
before it; `sglang_unified_eras.unified_factory` picks one for a release. This base builds the
pools and the cache, makes SGLang's requests and reads the tree, which every era shares.

The Python core is read white-box: its nodes, both components' locks, the Mamba LRU list and the
Full eviction order (`last_access_time`). The Rust core's nodes cannot be read from Python
(`node_by_id` raises `NotImplementedError`), so it is checked from outside: return values, sizes,
free lists, the KV and Mamba slots the tree holds (`all_values_flatten`), pool conservation and
the meaning of the data (`opaque = True`).
"""

from __future__ import annotations

import contextlib
import weakref
from array import array
from typing import Any, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from harness.caches.base import CacheUnderTest, storage_of, walk_tree
from harness.caches.sglang_0_5_20 import Sglang0520Cache
from harness.caches.sglang_loader import publish_server_args
from harness.caches.sglang_releases import unified_rules
from harness.real_scheduler import RELEASES as REAL_SCHEDULER_RELEASES
from harness.snapshot import NodeView, Path, Snapshot, TensorView
from reference import SGLANG_UNIFIED, Rules
from strategies.config import PAGE_SIZES, CacheConfig

TREE_CORES = ("python", "rust")
CORE_CLASSES = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}
MAX_NEW_TOKENS = 1 << 20  # the request's own limit; the harness's protocol decides when it finishes


class UnifiedMatch(NamedTuple):
    """What the scheduler takes from a match: the prefix's KV slots and the last nodes (ids)."""

    device_indices: torch.Tensor
    last_device_node: int
    last_host_node: int


class SglangUnifiedCache(Sglang0520Cache):
    """SGLang's `UnifiedRadixCache` (Full + Mamba) on one tree core (see the module docstring).
    Its pools are built and read as 0.5.20's `MambaRadixCache` adapter builds and reads them."""

    name = "sglang"
    default_protocol = "unified"
    protocols = ("unified", "unified-0.5.20", "scheduler")
    rules = SGLANG_UNIFIED
    tree_core = "python"
    settings_taken = {"mamba_strategy": ("no_buffer", "extra_buffer"), "page_size": PAGE_SIZES}
    # the tree's own self-check, called as the release's scheduler calls it
    sanity_check = CacheUnderTest.sanity_check

    def __init__(self, config: CacheConfig, tree_core: Optional[str] = None):
        if tree_core is not None:
            self.tree_core = tree_core
        if self.tree_core not in TREE_CORES:
            raise ValueError(f"--tree-core must be one of {list(TREE_CORES)}, got {self.tree_core!r}")
        self.name = f"sglang-{self.tree_core}"
        # the Python core's nodes are objects the memory check follows; the Rust core's are not
        self.opaque = self.tree_core == "rust"
        self.node_objects = not self.opaque
        super().__init__(config)
        self._extra_locks: Dict[int, List[Any]] = {}  # per request (id()): locks beyond req.lock

    @classmethod
    def release_rules(cls, version: str) -> Rules:
        return unified_rules(version)

    @classmethod
    def release_protocol(cls, version: str) -> str:
        """The release's own scheduler where the harness builds it (`harness.real_scheduler`),
        else the hand-written calls of its era."""
        return "scheduler" if version in REAL_SCHEDULER_RELEASES else cls.default_protocol

    def _build_cache(self, config: CacheConfig) -> Any:
        sgl = self.sgl
        publish_server_args(sgl)
        ct = sgl.ComponentType
        self.FULL, self.MAMBA = ct.FULL, ct.MAMBA
        params = sgl.CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv,
            page_size=config.page_size,
            tree_components=(ct.FULL, ct.MAMBA),
            **({"enable_mamba_extra_buffer": True} if config.mamba_strategy == "extra_buffer" else {}),
        )
        # the core is picked as serving picks it (0.5.20 reads only the variable; before 0.5.19
        # there is the Python core alone)
        backend = getattr(sgl.envs, "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", None)
        with contextlib.nullcontext() if backend is None else backend.override(self.tree_core):
            cache = sgl.UnifiedRadixCache(params)
        core = getattr(cache, "tree_core", None)  # none before 0.5.17: the cache is the tree
        if core is not None and type(core).__name__ != CORE_CLASSES[self.tree_core]:
            raise RuntimeError(f"asked for the {self.tree_core} tree core, SGLang built {type(core).__name__}")
        return cache

    # ----- requests ---------------------------------------------------------------------------

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Any:
        sgl = self.sgl
        req = sgl.Req(str(rid), "", array("q", tokens), sgl.SamplingParams(max_new_tokens=MAX_NEW_TOKENS), extra_key=extra_key)
        self._refresh_fill_ids(req)
        return req

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return self.sgl.RadixKey(array("q", tokens), extra_key)

    def set_fill(self, req: Any, tokens: Sequence[int]) -> None:
        """The request's next extend ends after `tokens` (`req.extend_end`)."""
        self._refresh_fill_ids(req)
        self._set_extend_end(req, len(tokens))

    def append_output(self, req: Any, token: int) -> None:
        req.output_ids.append(token)
        self._refresh_fill_ids(req)

    def adopt_match(self, req: Any, match: UnifiedMatch) -> None:
        """`match_kv_cache` and `init_next_round_input`: the prefix and last node, and the
        tree's share of the row (`cache_protected_len`)."""
        req.prefix_len = len(match.device_indices)
        req.last_node = match.last_device_node
        req.last_host_node = match.last_host_node
        self.slots_of(req).cache_protected_len = req.prefix_len

    def reset_for_retract(self, req: Any) -> None:
        req.reset_for_retract()

    def forget_req_slot(self, req: Any) -> None:
        """`release_kv_cache` already gave the row back through the request."""

    def last_node_of(self, req: Any) -> Any:
        return req.last_node

    def nodes_of(self, req: Any) -> List[Any]:
        """Its last node, last host node and best match node, and the node its lock is on (node
        objects in 0.5.16 and for impl's tree, whose handles are the nodes themselves)."""
        lock = getattr(req, "lock", None)
        return [req.last_node, req.last_host_node, getattr(req, "best_match_node", None), None if lock is None else lock.node]

    # ----- the cache's own calls --------------------------------------------------------------

    def evict(self, num_tokens: int) -> None:
        """`evict_to_free_tokens`' call for a shortfall of `num_tokens` (the protocol computes
        the shortfall, `UnifiedScheduler._evict_from_tree_cache`)."""
        self.cache.evict_for_alloc(self.sgl.EvictParams(num_tokens=num_tokens))

    def evict_mamba(self, num: int) -> None:
        """The Mamba shortfall, as `ensure_mamba_capacity` evicts it."""
        self.cache.evict_for_alloc(self.sgl.EvictParams(num_tokens=0, mamba_num=num))

    # ----- the era's calls: each era's adapter makes them as its release's helpers do ------------

    def _era_call(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is the unified caches' base: an era's adapter makes the calls (unified_factory)")

    _refresh_fill_ids = _set_extend_end = prefix_of = match_prefix = _era_call
    cache_unfinished_req = cache_finished_req = lock_req = unlock_req = _release_extra_locks = _era_call

    def inc_lock_ref(self, node: Any) -> None:
        raise NotImplementedError("UnifiedRadixCache's locks are taken per request (lock_req)")

    dec_lock_ref = inc_lock_ref

    def reset(self) -> None:
        super().reset()
        self._extra_locks.clear()

    # ----- reading the tree -------------------------------------------------------------------

    @property
    def tree(self) -> Any:
        """What holds the nodes and the LRU lists: the tree core (0.5.17 on)."""
        return self.cache.tree_core

    def root_handle(self) -> Any:
        """How the tree names its root where it hands out nodes (a node id from 0.5.17)."""
        return self.cache.root_node_handle()

    def _path_kv(self, node: int) -> torch.Tensor:
        """The KV slots from the root to `node` (`path_device_indices` in 0.5.23)."""
        return self.tree.collect_full_device_indices(node, self.root_handle())

    def node_kv(self, node: Any) -> Tuple[int, ...]:
        """The KV slots of every token from the root to `node` (a node id), as the tree gives
        them: how a node is named when the tree cannot be read (`opaque`)."""
        return tuple(self._path_kv(node).tolist())

    def node_object(self, node: Any) -> Any:
        """The Python core's node object for a node id (None once it left the tree)."""
        return None if node is None else self.tree._node_arena.get(node)

    def path_of(self, node: Any) -> Optional[Path]:
        """The path of a node (an id) of the Python core, or None for no node or one that left
        the tree."""
        if self.opaque:
            raise NotImplementedError("the Rust tree core's nodes cannot be read; name them by node_kv")
        return super().path_of(self.node_object(node))

    def in_tree(self, node: Any) -> bool:
        obj = self.node_object(node)
        return obj is not None and super().in_tree(obj)

    def snapshot(self) -> Snapshot:
        if self.opaque:
            return self._outside_snapshot()
        FULL, MAMBA = self.FULL, self.MAMBA
        walked = walk_tree(self.tree.root_node)
        nodes: Dict[Path, NodeView] = {}
        tensors: List[TensorView] = []
        by_node: Dict[int, Path] = {}
        refs = {id(node): weakref.ref(node) for node, _, _ in walked}
        for node, path, parent in walked:
            full, mamba = node.component_data[FULL], node.component_data[MAMBA]
            kv = () if full.value is None else tuple(full.value.tolist())
            state = None if mamba.value is None else int(mamba.value.reshape(-1)[0])
            nodes[path] = NodeView(path, parent, kv, state, full.lock_ref, mamba.lock_ref, len(node.children))
            by_node[id(node)] = path
            if full.value is not None:
                tensors.append(TensorView(path, "KV slots", full.value.dtype, full.value.device, storage_of(full.value)))
            if mamba.value is not None:
                tensors.append(TensorView(path, "Mamba slot", mamba.value.dtype, mamba.value.device, storage_of(mamba.value)))
        # the Full component keeps no list: its eviction order is `last_access_time`
        full_order = [by_node[id(n)] for n, _, _ in sorted(walked, key=lambda w: -w[0].last_access_time)]
        mamba_members, mamba_ok = self._read_mamba_lru(by_node)
        root = self.tree.root_node
        return Snapshot(
            nodes=nodes,
            full_lru=full_order,
            mamba_lru=mamba_members,
            full_links_ok=True,
            mamba_links_ok=mamba_ok,
            sizes=self.sizes(),
            root_locks=(root.component_data[FULL].lock_ref, root.component_data[MAMBA].lock_ref),
            kv_free=self.kv_free_slots(),
            mamba_free=self.mamba_free_slots(),
            req_free=self.req_free_slots(),
            node_refs=refs,
            tensors=tensors,
        )

    def _read_mamba_lru(self, by_node: Dict[int, Path]) -> Tuple[List[Path], bool]:
        """The Mamba LRU list as its links give it, most recent first, and whether its links
        agree both ways, end at its ends and count its size."""
        lru = self.tree.lru_lists[self.MAMBA]
        pt, size = lru._pt, len(lru.cache)
        members: List[Path] = []
        link = lru.head
        while link.lru_next[pt] is not lru.tail:
            following = link.lru_next[pt]
            if following is None or following.lru_prev[pt] is not link or len(members) == size:
                return members, False
            if following is not getattr(lru, "mid", None):  # the session partition's marker
                members.append(by_node.get(id(following), ("<not in tree>", (following.id,))))
            link = following
        return members, lru.tail.lru_prev[pt] is link and len(members) == size

    def _outside_snapshot(self) -> Snapshot:
        """What can be read of a tree whose nodes cannot be: the slots it holds and its sizes."""
        return Snapshot(
            nodes=None,
            full_lru=[],
            mamba_lru=[],
            full_links_ok=True,
            mamba_links_ok=True,
            sizes=self.sizes(),
            root_locks=(1, 1),
            kv_free=self.kv_free_slots(),
            mamba_free=self.mamba_free_slots(),
            req_free=self.req_free_slots(),
            node_refs={},
            tensors=[],
            tree_kv=self.cache.all_values_flatten().tolist(),
            tree_mamba=self.cache.all_mamba_values_flatten().reshape(-1).tolist(),
        )

    def format_tree(self) -> str:
        if self.opaque:
            return f"(the Rust tree core's nodes cannot be read; it holds KV slots {self.cache.all_values_flatten().tolist()})"
        FULL, MAMBA = self.FULL, self.MAMBA
        lines = []
        stack = [(child, 0) for child in reversed(list(self.tree.root_node.children.values()))]
        while stack:
            node, depth = stack.pop()
            full, mamba = node.component_data[FULL], node.component_data[MAMBA]
            state = "tombstone" if mamba.value is None else f"mamba={int(mamba.value.reshape(-1)[0])}"
            kv = None if full.value is None else full.value.tolist()
            lines.append(f"{'  ' * depth}{list(node.key.token_ids)} kv={kv} {state} locks={full.lock_ref}/{mamba.lock_ref}")
            stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))
        return "\n".join(lines) or "(empty tree)"

