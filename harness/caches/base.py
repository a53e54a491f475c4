"""`CacheUnderTest`: one cache under test with its three pools, as the harness builds, calls and
reads it.

A scheduler protocol (`harness.protocols`) makes its calls through the methods below, which pass
their keyword arguments on verbatim: a call the cache does not accept raises inside the cache, as
it would in the release's scheduler. The methods are written for SGLang 0.5.4's API, which `impl`
shares; a cache of another API era overrides them to make its own era's calls. The readers
(`snapshot`, `read_lru`, the data readers) look straight at the cache's nodes, list links,
counters and pools: nothing here asks the cache whether it is consistent.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness import digest
from harness.snapshot import NodeView, Path, Snapshot, TensorView
from reference import SGLANG_0_5_4, Rules
from strategies.config import CacheConfig, Setting

ROOT_PATH: Path = (None, ())


class CacheUnderTest:
    """A cache and its pools, built from a `CacheConfig`.

    Subclasses set `cache`, `kv` (the KV allocator), `req_pool` (the request-to-token pool),
    `mamba_pool` (where the Mamba states live) and `mamba_slots` (what hands out Mamba slots: the
    pool itself up to SGLang 0.5.4), and say how to read their LRU lists and where the harness's
    KV data lives.
    """

    name = "abstract"
    release = ""  # the version of the code under test
    # the SGLang release whose own scheduler drives it when that is not its own code's (impl's
    # tree inside SGLang's scheduler): that scheduler's known findings are met here too
    scheduler_release: Optional[str] = None
    default_protocol = "contract"  # the hand-written scheduler protocol of the cache's release
    # the protocols whose calls the cache takes (a trace recorded under one of them replays under
    # it across releases: the same calls, each release's cache)
    protocols: Tuple[str, ...] = ("contract", "sglang-0.5.4")
    rules: Rules = SGLANG_0_5_4  # what the reference model follows for this cache
    misuse_error: type = Exception  # raised when the cache refuses a misuse (e.g. a bad unlock)
    mamba_exhausted_error: type = Exception  # raised when no Mamba slot is left even after evicting
    # whether lock calls on a node no longer in the tree are refused, so that the direct-API
    # misuse step may try one
    refuses_detached_nodes: bool = False
    # whether the cache is a library called directly as well as by a scheduler (impl's README
    # shows it), so that the contract protocol adds the direct API calls
    # (`harness.protocols.direct_api`); SGLang's caches are driven by their schedulers alone
    direct_api: bool = False
    # whether the tree's nodes cannot be read (the checks then use what the cache reports from
    # outside: `snapshot().nodes` is None and a node is named by `node_kv`, not `path_of`)
    opaque: bool = False
    # whether the tree's nodes are Python objects with parent links that the memory check can
    # follow (`node_object` gives the object for what the cache hands out)
    node_objects: bool = True
    # the server settings it can be built with: per `SERVER_SETTINGS` field, the values it
    # takes (a field not named: every value)
    settings_taken: Dict[str, Tuple[Setting, ...]] = {"mamba_strategy": ("no_buffer",), "page_size": (1,)}

    config: CacheConfig
    device: torch.device
    cache: Any
    kv: Any
    req_pool: Any
    mamba_pool: Any
    mamba_slots: Any

    @classmethod
    def release_protocol(cls, version: str) -> str:
        """The protocol a run on this cache of release `version` uses unless told otherwise."""
        return cls.default_protocol

    def is_mamba_exhausted(self, exc: BaseException) -> bool:
        """Whether `exc` (a `mamba_exhausted_error`) says the Mamba pool ran out."""
        return True

    def advance_clock(self, seconds: float) -> None:
        """Let `seconds` of time pass for a cache that reads the clock (a forward pass)."""

    # ----- requests ---------------------------------------------------------------------------

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Any:
        raise NotImplementedError

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Any:
        raise NotImplementedError

    def indices(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.device)

    def set_fill(self, req: Any, tokens: Sequence[int]) -> None:
        req.fill_ids = list(tokens)

    def append_output(self, req: Any, token: int) -> None:
        req.output_ids.append(token)

    def adopt_match(self, req: Any, match: Any) -> None:
        """What the scheduler records of a match on the request (`init_next_round_input`)."""
        req.prefix_indices = match.device_indices
        req.last_node = match.last_device_node

    def reset_for_retract(self, req: Any) -> None:
        """`Req.reset_for_retract`'s effect on the fields the cache reads."""
        req.prefix_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        req.last_node = None
        req.mamba_pool_idx = None

    def forget_req_slot(self, req: Any) -> None:
        """The request lets go of the request slot it was given (its slot already freed)."""
        req.req_pool_idx = None

    def req_slot_of(self, req: Any) -> Optional[int]:
        return None if req.req_pool_idx is None else int(req.req_pool_idx)

    def mamba_slot_of(self, req: Any) -> Optional[int]:
        return None if req.mamba_pool_idx is None else int(req.mamba_pool_idx)

    def prefix_of(self, req: Any) -> List[int]:
        return req.prefix_indices.tolist()

    def last_node_of(self, req: Any) -> Any:
        return req.last_node

    def nodes_of(self, req: Any) -> List[Any]:
        """Every tree node a request refers to (the scheduler keeps them alive while it lives)."""
        return [self.last_node_of(req)]

    # ----- the cache's own calls --------------------------------------------------------------

    def match_prefix(self, key: Any, **kwargs: Any) -> Any:
        return self.cache.match_prefix(key=key, **kwargs)

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        prefix_len, exist = self.cache.insert(key, kv, mamba)
        return prefix_len, exist

    def cache_finished_req(self, req: Any, **kwargs: Any) -> None:
        self.cache.cache_finished_req(req, **kwargs)

    def cache_unfinished_req(self, req: Any, **kwargs: Any) -> None:
        self.cache.cache_unfinished_req(req, **kwargs)

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(num_tokens)

    def evict_mamba(self, num: int) -> None:
        self.cache.evict_mamba(num)

    def inc_lock_ref(self, node: Any) -> None:
        self.cache.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any) -> None:
        self.cache.dec_lock_ref(node)

    def lock_req(self, req: Any) -> None:
        """The scheduler locks the request's last node (`inc_lock_ref(req.last_node)`)."""
        self.inc_lock_ref(self.last_node_of(req))

    def unlock_req(self, req: Any) -> None:
        """The scheduler releases one lock it took on the request's last node."""
        self.dec_lock_ref(self.last_node_of(req))

    def reset(self) -> None:
        self.cache.reset()

    def sanity_check(self) -> None:
        self.cache.sanity_check()

    def sizes(self) -> Tuple[int, int, int, int]:
        """(full evictable, full protected, mamba evictable, mamba protected), as the cache counts."""
        c = self.cache
        return (c.full_evictable_size(), c.full_protected_size(), c.mamba_evictable_size(), c.mamba_protected_size())

    # ----- the pools' calls -------------------------------------------------------------------

    def kv_available(self) -> int:
        return self.kv.available_size()

    def kv_alloc(self, n: int) -> Optional[torch.Tensor]:
        return self.kv.alloc(n)

    def kv_free(self, index: torch.Tensor) -> None:
        self.kv.free(index)

    def free_group_begin(self) -> None:
        self.kv.free_group_begin()

    def free_group_end(self) -> None:
        self.kv.free_group_end()

    def kv_clear(self) -> None:
        self.kv.clear()

    def mamba_available(self) -> int:
        return self.mamba_slots.available_size()

    def mamba_alloc(self, n: int) -> Optional[torch.Tensor]:
        return self.mamba_slots.alloc(n)

    def mamba_free(self, index: torch.Tensor) -> None:
        self.mamba_slots.free(index)

    def give_mamba_slot(self, req: Any, slot: torch.Tensor) -> None:
        """The request takes `slot` (a 0-d index) as its own Mamba slot."""
        req.mamba_pool_idx = slot

    def free_req_mamba(self, req: Any) -> None:
        """Give back the Mamba slot a request holds without a request slot, as later releases
        do (`mamba_pool.free(req.mamba_pool_idx.unsqueeze(-1))`); the request lets go of it."""
        self.mamba_slots.free(req.mamba_pool_idx.unsqueeze(-1))
        req.mamba_pool_idx = None

    def req_available(self) -> int:
        return self.req_pool.available_size()

    def req_alloc(self, reqs: Sequence[Any]) -> Optional[List[int]]:
        """`alloc_req_slots`' pool call: request slots for `reqs` (and a Mamba slot for each one
        without), assigned to each request as the scheduler's `prepare_for_extend` does."""
        got = self.req_pool.alloc(len(reqs), list(reqs))
        if got is not None:
            for req, slot in zip(reqs, got):
                req.req_pool_idx = slot
        return got

    def req_free(self, req: Any, **kwargs: Any) -> None:
        self.req_pool.free(req.req_pool_idx, **kwargs)

    def req_pool_clear(self) -> None:
        self.req_pool.clear()

    def write_row(self, req: Any, start: int, slots: torch.Tensor) -> None:
        """`req_to_token[req's slot, start:start + len(slots)] = slots`."""
        self.req_pool.write((req.req_pool_idx, slice(start, start + slots.shape[0])), slots.to(self.req_pool.req_to_token.dtype))

    def req_rows(self, length: int) -> List[List[int]]:
        """The first `length` positions of every request slot's req_to_token row, in one transfer."""
        return self.req_pool.req_to_token[:, :length].tolist()

    # ----- the data the harness's forward pass writes ------------------------------------------

    def write_kv(self, slots: Sequence[int], values: Sequence[int]) -> None:
        """Store each value (a digest) as the KV data of its slot."""
        raise NotImplementedError

    def kv_data(self) -> List[int]:
        """The value stored as the KV data of every slot 0..size."""
        raise NotImplementedError

    def mamba_tensors(self) -> List[torch.Tensor]:
        """The Mamba pool's state tensors, each indexed [layer, slot, ...]."""
        cache = self.mamba_pool.mamba_cache
        conv = cache.conv if isinstance(cache.conv, (list, tuple)) else [cache.conv]  # a list from 0.5.6
        return [cache.temporal, *conv]

    def write_state(self, slot: int, value: int) -> None:
        """Set Mamba slot `slot`'s states to hold `value` (a digest) in every layer."""
        index = self.indices([slot])
        for state in self.mamba_tensors():
            state.index_copy_(1, index, digest.state_values(value, state).unsqueeze(1))

    def wipe_data(self) -> None:
        """Every KV slot's data and every Mamba state back to zero, as a fresh build holds them
        (a cache reused for the next program then remembers nothing computed for the last)."""
        slots = len(self.kv_data())
        self.write_kv(range(slots), [0] * slots)
        for state in self.mamba_tensors():
            state.zero_()

    def all_free(self) -> bool:
        """Whether every KV, Mamba and request slot is on its free list."""
        c = self.config
        return (self.kv_available(), self.mamba_available(), self.req_available()) == (c.kv_size, c.mamba_size, c.req_size)

    def state_digests(self) -> List[Optional[int]]:
        """Per Mamba slot (0 up to the last one the pool hands out): the digest its states hold
        if every layer of every state tensor holds the same one, else None."""
        end = self.rules.first_mamba_slot + self.config.mamba_size
        found: List[Optional[int]] = [None] * end
        agreed = [True] * end
        for state in self.mamba_tensors():
            layers = state[:, :end].flatten(2).tolist()  # one transfer per tensor
            for layer in layers:
                for slot, elements in enumerate(layer):
                    value = digest.decode(elements)
                    if value is None or (found[slot] is not None and found[slot] != value):
                        agreed[slot] = False
                    found[slot] = value
        return [value if ok else None for value, ok in zip(found, agreed)]

    # ----- reading the tree -------------------------------------------------------------------

    def path_of(self, node: Any) -> Optional[Path]:
        """The (extra_key, tokens from the root) name of a node (None for no node)."""
        if node is None:
            return None
        segments = []
        extra = None
        while node is not self.cache.root_node:
            segments.append(node.key.token_ids)
            extra = node.key.extra_key
            node = node.parent
            if node is None:
                return ("<detached>", tuple(t for seg in reversed(segments) for t in seg))
        return (extra, tuple(t for seg in reversed(segments) for t in seg)) if segments else ROOT_PATH

    def node_object(self, node: Any) -> Any:
        """The node object for what the cache hands out as a node (the node itself, or an id)."""
        return node

    def node_kv(self, node: Any) -> Tuple[int, ...]:
        """The KV slots from the root to `node`, as the cache gives them (for `opaque` caches)."""
        raise NotImplementedError

    def in_tree(self, node: Any) -> bool:
        """Whether `node` is still reachable from the root (walking its parents)."""
        root = self.cache.root_node
        while node is not root:
            parent = node.parent
            if parent is None or node not in parent.children.values():
                return False
            node = parent
        return True

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        """The "full" or "mamba" LRU list as its links give it, in one walk: its members, most
        recently used first, and whether its prev/next links agree both ways, end at the list's
        ends and count its size (and any order stamps hold). The walk is the harness's own; it
        never asks the list whether it is consistent."""
        raise NotImplementedError

    def free_list_tensors(self) -> List[torch.Tensor]:
        """Every tensor the pools keep their free slots in (the checks compare storages)."""
        raise NotImplementedError

    def request_rows(self) -> torch.Tensor:
        return self.req_pool.req_to_token

    def row_views(self, slot: int) -> List[torch.Tensor]:
        """Every tensor that is request slot `slot`'s req_to_token row (one per pool)."""
        return [self.request_rows()[slot]]

    def kv_free_slots(self) -> List[int]:
        """The free KV slots in hand-out order."""
        raise NotImplementedError

    def mamba_free_slots(self) -> List[int]:
        return self.mamba_slots.free_slots.tolist()

    def req_free_slots(self) -> List[int]:
        return list(self.req_pool.free_slots)

    def snapshot(self) -> Snapshot:
        cache = self.cache
        walked = walk_tree(cache.root_node)
        path_by_id: Dict[int, Path] = {id(node): path for node, path, _ in walked}
        refs: Dict[int, Any] = {id(node): weakref.ref(node) for node, _, _ in walked}
        tensors = []
        for node, path, _ in walked:
            tensors.append(_view(path, "KV slots", node.value))
            if node.mamba_value is not None:
                tensors.append(_view(path, "Mamba slot", node.mamba_value))
        # every node's KV slots, then every holder's Mamba slot, read with one transfer, not
        # one per node
        kv_tensors = [n.value.to(torch.int64) for n, _, _ in walked]
        holders = [n.mamba_value.reshape(-1).to(torch.int64) for n, _, _ in walked if n.mamba_value is not None]
        slots = torch.cat(kv_tensors + holders).tolist() if walked else []
        mamba_slots = iter(slots[len(slots) - sum(h.numel() for h in holders) :])
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
            return [path_by_id.get(id(n), ("<not in tree>", (getattr(n, "id", -1),))) for n in members]

        return Snapshot(
            nodes=nodes,
            full_lru=paths(full_members),
            mamba_lru=paths(mamba_members),
            full_links_ok=full_links_ok,
            mamba_links_ok=mamba_links_ok,
            sizes=self.sizes(),
            root_locks=(cache.root_node.full_lock_ref, cache.root_node.mamba_lock_ref),
            kv_free=self.kv_free_slots(),
            mamba_free=self.mamba_free_slots(),
            req_free=self.req_free_slots(),
            node_refs=refs,
            tensors=tensors,
        )

    def format_tree(self) -> str:
        """The tree, one node per line, indented by depth."""
        lines = []
        stack = [(child, 0) for child in reversed(list(self.cache.root_node.children.values()))]
        while stack:
            node, depth = stack.pop()
            state = "tombstone" if node.mamba_value is None else f"mamba={int(node.mamba_value.reshape(-1)[0])}"
            lines.append(
                f"{'  ' * depth}{list(node.key.token_ids)} kv={node.value.tolist()} {state} "
                f"locks={node.full_lock_ref}/{node.mamba_lock_ref}"
            )
            stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))
        return "\n".join(lines) or "(empty tree)"


def walk_tree(root: Any) -> List[Tuple[Any, Path, Optional[Path]]]:
    """Every node below `root` (nodes with `children` and a `key`), each with its path and its
    parent's path (None under the root), in the order a depth-first walk meets them."""
    walked = []
    stack = [(root, ROOT_PATH)]
    while stack:
        node, path = stack.pop()
        parent = None if node is root else path
        for child in node.children.values():
            key = child.key
            child_path = (key.extra_key, path[1] + tuple(key.token_ids))
            walked.append((child, child_path, parent))
            stack.append((child, child_path))
    return walked


def _view(path: Path, field: str, tensor: torch.Tensor) -> TensorView:
    return TensorView(path, field, tensor.dtype, tensor.device, storage_of(tensor))


def storage_of(tensor: torch.Tensor) -> int:
    """The address of the storage behind `tensor` (views of one tensor share it)."""
    return tensor.untyped_storage().data_ptr()
