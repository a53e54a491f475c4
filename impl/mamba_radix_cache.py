"""`MambaRadixCache`: the hybrid (full-attention KV + Mamba state) radix prefix cache.

Behaviour follows SGLang 0.5.4's `MambaRadixCache` (see README, "Rules"); the differences are
speed (eviction candidates come from queues, not list walks; pool frees are batched per call)
and that misuse raises `CacheMisuseError` before anything changes. With
`enable_mamba_extra_buffer` (0.5.7's addition) the tree takes tracked checkpoints instead of the
running state, and then `page_size` may exceed 1 (keys in whole pages, children keyed by page).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from impl.errors import CacheMisuseError, MambaPoolExhaustedError
from impl.kv_allocator import TokenToKVPoolAllocator
from impl.lru_list import LRUList
from impl.radix_key import RadixKey, child_key, child_key_at, shared_pages
from impl.req_to_token_pool import HybridReqToTokenPool
from impl.slot_ledger import is_index_tensor
from impl.tree_node import TreeNode


class MatchResult(NamedTuple):
    """What `match_prefix` found: the reusable KV slots and the node that ends them."""

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    host_hit_length: int = 0


class CacheInvariantError(AssertionError):
    """`sanity_check` found the tree, its LRU lists or its size counters inconsistent."""


def _count(value: Any, method: str) -> int:
    """`value` as a non-negative int (an integer of any type: numpy's, a 0-d tensor's), else
    `CacheMisuseError` naming it."""
    try:
        count = -1 if isinstance(value, bool) else operator.index(value)
    except TypeError:
        count = -1
    if count < 0:
        raise CacheMisuseError(f"{method}: expected a non-negative number of slots, got {value!r}")
    return count


def _is_evictable_leaf(node: TreeNode) -> bool:
    return not node.children and node.full_lock_ref == 0


def _is_evictable_mamba(node: TreeNode) -> bool:
    return node.mamba_lock_ref == 0


class MambaRadixCache:
    """Radix tree over token ids whose nodes hold KV slots and, optionally, a Mamba state.

    Invariants: no leaf is a tombstone; a KV-locked node's ancestors are KV-locked; the full LRU
    list holds every non-root node and the Mamba list every Mamba holder, most recent first; the
    four size counters equal the token / state counts of unlocked and locked nodes.
    """

    def __init__(
        self,
        req_to_token_pool: HybridReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        page_size: int = 1,
        disable: bool = False,
        enable_mamba_extra_buffer: bool = False,
    ):
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise CacheMisuseError(f"MambaRadixCache page_size must be a positive int, got {page_size!r}")
        if page_size != 1 and not enable_mamba_extra_buffer:
            raise CacheMisuseError(
                f"MambaRadixCache takes page_size={page_size!r} only with enable_mamba_extra_buffer=True "
                "(a running state is of the whole sequence, not of whole pages)"
            )
        if req_to_token_pool is None or token_to_kv_pool_allocator is None:
            raise CacheMisuseError(
                "MambaRadixCache needs a request-to-token pool and a KV allocator, got "
                f"req_to_token_pool={req_to_token_pool!r}, token_to_kv_pool_allocator={token_to_kv_pool_allocator!r}"
            )
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        # the request's state is tracked into ping-pong slots at track boundaries; the tree takes
        # the tracked state (`mamba_last_track_seqlen`), never the running one
        self.enable_mamba_extra_buffer = enable_mamba_extra_buffer
        self.device = token_to_kv_pool_allocator.device
        self.reset()

    # ----- public API -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the whole tree (the pools are the caller's to clear). The old tree is taken
        apart, so that reference counting alone reclaims it."""
        if getattr(self, "root_node", None) is not None:
            self._dismantle()
        self._node_ids = itertools.count()
        self.root_node = TreeNode(next(self._node_ids), RadixKey([]), self._empty_indices())
        self.root_node.full_lock_ref = 1
        self.root_node.mamba_lock_ref = 1
        self.full_evictable_size_ = 0
        self.mamba_evictable_size_ = 0
        self.full_protected_size_ = 0
        self.mamba_protected_size_ = 0
        self.full_lru_list = LRUList("full_link", "full", _is_evictable_leaf)
        self.mamba_lru_list = LRUList("mamba_link", "mamba", _is_evictable_mamba)

    def _dismantle(self) -> None:
        """Unlink every node from its children and both lists (no cycle is left to collect)."""
        for lru in (self.full_lru_list, self.mamba_lru_list):
            lru.clear()
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children = {}
            node.in_tree = False

    def match_prefix(self, key: RadixKey, **kwargs) -> MatchResult:
        """The longest cached prefix of `key` that ends at a node holding a Mamba state.

        A partial match inside a node splits it (the upper part is a new tombstone). The returned
        node and its ancestors become most recently used, the node ahead of its parents. With
        `cow_mamba=True` and `req=` (a request not yet given a request slot), the node's Mamba state
        is copied into the request's own Mamba slot, allocated (evicting one state if the pool is
        full) when the request has none.
        """
        cow_mamba: bool = kwargs.get("cow_mamba", False)
        req = kwargs.get("req", None)
        self._check_key(key)
        if cow_mamba:
            if req is None:
                raise CacheMisuseError("match_prefix(cow_mamba=True) needs req=")
            if req.req_pool_idx is not None:
                raise CacheMisuseError(
                    f"match_prefix(cow_mamba=True) on a request that already has request slot "
                    f"{req.req_pool_idx}"
                )
        if self.disable or len(key) == 0:
            return MatchResult(self._empty_indices(), self.root_node, self.root_node)

        value, last_node = self._match_prefix_helper(key)
        if cow_mamba and last_node.mamba_value is not None:
            self._copy_mamba_to_req(last_node, req)
        indices = torch.cat(value) if value else self._empty_indices()
        return MatchResult(indices, last_node, last_node)

    def insert(self, key: RadixKey, value: Optional[torch.Tensor] = None, mamba_value=None) -> Tuple[int, bool]:
        """Insert `key` with KV slots `value` ending in Mamba state `mamba_value`.

        Returns `(prefix_len, mamba_exist)`: how many leading tokens were already cached (the
        caller still owns, and must free, its slots for them) and whether the node at the end of
        `key` already held a Mamba state (then `mamba_value` was not taken).
        """
        self._check_key(key)
        if value is None:
            value = torch.tensor(key.token_ids, dtype=torch.int64, device=self.device)
        if len(value) != len(key):
            raise CacheMisuseError(
                f"insert: value has {len(value)} KV slots but the key has {len(key)} tokens"
            )
        if mamba_value is None:
            raise CacheMisuseError("insert: mamba_value must be given (a Mamba slot, shape [1])")
        if len(mamba_value) != 1:
            raise CacheMisuseError(
                f"insert: mamba_value must hold exactly one Mamba slot, got {len(mamba_value)}"
            )
        for name, tensor in (("value", value), ("mamba_value", mamba_value)):
            if not is_index_tensor(tensor):
                raise CacheMisuseError(
                    f"insert: {name} must be an integer index tensor, got {getattr(tensor, 'dtype', type(tensor).__name__)}"
                )
        if self.disable:
            return 0, False
        # the tree keeps copies of its own: the caller may reuse its tensors
        value = value.to(device=self.device, dtype=torch.int64, copy=True)
        mamba_value = mamba_value.to(device=self.device, dtype=torch.int64, copy=True)
        return self._insert_helper(key, value, mamba_value)[:2]

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        """Put a finished request's computed tokens (its input and all but its last output
        token) into the tree and release its slots and its lock. With `is_insert=False` (a
        retracted or failed request) nothing goes into the tree: the request's own KV slots,
        its request slot and its Mamba slot are freed. (0.5.4 inserted `(input + output)[:-1]`,
        one token short for a request with no output: the last input token's KV slot leaked
        and the state sat on a prefix one token shorter than the one it was computed for; and
        it refused `is_insert`, which its own scheduler passes on retraction.)"""
        self._check_req(req, "cache_finished_req")
        kv_len = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :kv_len]
        if self.enable_mamba_extra_buffer and not self.disable:
            return self._cache_finished_tracked(req, is_insert, kv_indices)
        if self.disable:
            self.token_to_kv_pool_allocator.free(kv_indices)
            self.req_to_token_pool.free(req.req_pool_idx)
            return
        if not is_insert:
            self.token_to_kv_pool_allocator.free(kv_indices[len(req.prefix_indices) :])
            self.req_to_token_pool.free(req.req_pool_idx)
            self.dec_lock_ref(req.last_node)
            return

        token_ids = (req.origin_input_ids + req.output_ids)[:kv_len]
        mamba_value = self._req_mamba_slot(req).to(torch.int64, copy=True)  # the tree's own copy
        new_prefix_len, mamba_exist = self._insert_helper(
            RadixKey._trusted(token_ids, req.extra_key),
            kv_indices.to(dtype=torch.int64, copy=True),  # the tree's own copies (insert would copy again)
            mamba_value,
        )[:2]
        self.token_to_kv_pool_allocator.free(kv_indices[len(req.prefix_indices) : new_prefix_len])
        self.req_to_token_pool.free(req.req_pool_idx, free_mamba_cache=mamba_exist)
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        """Put the tokens a running request has computed (`fill_ids`) into the tree.

        The tree gets a fork of the request's Mamba state (one state is evicted if the pool is
        full); the request then shares the tree's KV slots for all of `fill_ids`, and its lock
        moves to the node that ends them.
        """
        self._check_req(req, "cache_unfinished_req")
        if self.enable_mamba_extra_buffer and not self.disable:
            return self._cache_unfinished_tracked(req)
        if self.disable:
            kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(req.fill_ids)]
            req.prefix_indices = kv_indices
            return

        token_ids = req.fill_ids if type(req.fill_ids) is list else list(req.fill_ids)
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(token_ids)]
        if kv_indices.shape[0] != len(token_ids):
            raise CacheMisuseError(
                f"cache_unfinished_req: request {req.rid!r} has {len(token_ids)} fill_ids but its "
                f"row holds {kv_indices.shape[0]} KV slots"
            )
        value = kv_indices.to(dtype=torch.int64, copy=True)
        mamba_pool = self.req_to_token_pool.mamba_pool
        req_mamba = self._req_mamba_slot(req)
        forked = mamba_pool.fork_from(req_mamba)
        if forked is None:
            self.evict_mamba(1)
            forked = mamba_pool.fork_from(req_mamba)
            if forked is None:
                raise MambaPoolExhaustedError(
                    f"cache_unfinished_req: no Mamba slot for request {req.rid!r} even after "
                    f"evicting (pool of {mamba_pool.size}, all states locked)"
                )
        key = RadixKey._trusted(token_ids, req.extra_key)
        # the fork is a view of the pool's free list: the tree keeps a copy of its own
        new_prefix_len, mamba_exist, new_last_node, split = self._insert_helper(key, value, forked.clone())
        prefix_len = req.prefix_indices.shape[0]
        if new_prefix_len > prefix_len:
            self.token_to_kv_pool_allocator.free(kv_indices[prefix_len:new_prefix_len])
        if mamba_exist:
            mamba_pool.free(forked)

        # The seed matches the key again here. That match ends at the node where the key ends
        # (it holds a Mamba state now), answers the KV of the whole path, and refreshes the path;
        # the refresh changes the order only when the insert split a node (the split's lower half
        # was put ahead of the path), so only then is it repeated.
        if split:
            self._refresh_path(self._path_from(new_last_node))
        if new_prefix_len == prefix_len:
            # no other request cached any of these tokens meanwhile: the row (the old prefix, then
            # the request's own slots, now the tree's) spells the new prefix already
            new_indices = value.clone()
        else:
            path = self._path_from(new_last_node)
            new_indices = torch.cat([node.value for node in reversed(path)])
            # the row already holds the request's own slots past new_prefix_len
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(prefix_len, new_prefix_len)), new_indices[prefix_len:new_prefix_len]
            )
        # the lock moves down the path (the old last node is the new one or an ancestor of it);
        # taking the new lock first keeps the shared ancestors locked throughout, so they are not
        # offered for eviction and taken back; the counts end as with the seed's order
        self.inc_lock_ref(new_last_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices = new_indices
        req.last_node = new_last_node

    # ----- the extra buffer ---------------------------------------------------------------------
    # With `enable_mamba_extra_buffer` the forward pass checkpoints a request's state into one of
    # its track slots (`req.mamba_ping_pong_track_buffer`, two under the overlap loop) at track
    # boundaries, and the scheduler records the length of the latest (`mamba_last_track_seqlen`)
    # and, for a ping-pong pair, of the one before (`mamba_prev_track_seqlen`). The tree takes a
    # tracked state, keyed by exactly the tokens it was computed from, never the running state.
    # The request pool keeps the pair: `get_mamba_ping_pong_keep_idx` (the latest),
    # `get_mamba_ping_pong_other_idx`, `donate_mamba_ping_pong_slot(req, fresh)` (the latest out,
    # a fresh slot in its place), `free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=)`.

    def _tracked_checkpoint(self, req, n: int) -> Optional[Tuple[int, int]]:
        """(length, track position) of the tracked state the tree may take for a request's first
        `n` tokens: the latest if no longer than `n`, else the one before it (a ping-pong pair)
        if that one is; None when neither is, or when its length is not whole pages (its key
        cannot be cut to it)."""
        pool = self.req_to_token_pool
        latest = req.mamba_last_track_seqlen
        if latest is None:
            return None
        keep = pool.get_mamba_ping_pong_keep_idx(req)
        picked = None
        if 0 < latest <= n:
            picked = latest, keep
        else:
            before = req.mamba_prev_track_seqlen
            if pool.mamba_ping_pong_track_buffer_size == 2 and before is not None and 0 < before <= n:
                picked = before, pool.get_mamba_ping_pong_other_idx(keep)
        if picked is None or picked[0] % self.page_size:
            return None
        return picked

    def _cache_finished_tracked(self, req, is_insert: bool, kv_indices: torch.Tensor) -> None:
        """`cache_finished_req` with the extra buffer: the tokens go in as far as the tracked
        state (`_tracked_checkpoint`), with that track slot; the request's
        KV past the key and its duplicates are freed, its other states (all of them when the
        tree had the state already or took none) and its request slot released, its lock too."""
        prefix_len = len(req.prefix_indices)
        picked = self._tracked_checkpoint(req, len(kv_indices)) if is_insert else None
        pool, allocator = self.req_to_token_pool, self.token_to_kv_pool_allocator
        keep = None
        if picked is None:
            allocator.free(kv_indices[prefix_len:])
        else:
            length, position = picked
            tokens = (req.origin_input_ids + req.output_ids)[:length]
            state = req.mamba_ping_pong_track_buffer[position].reshape(1).to(torch.int64, copy=True)
            new_prefix_len, exist = self._insert_helper(
                RadixKey._trusted(tokens, req.extra_key), kv_indices[:length].to(dtype=torch.int64, copy=True), state
            )[:2]
            if new_prefix_len > prefix_len:
                allocator.free(kv_indices[prefix_len:new_prefix_len])
            allocator.free(kv_indices[max(length, prefix_len):])
            keep = None if exist else position
        pool.free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=keep)
        pool.free(req.req_pool_idx, free_mamba_cache=False)
        req.mamba_last_track_seqlen = req.mamba_prev_track_seqlen = None
        self.dec_lock_ref(req.last_node)

    def _cache_unfinished_tracked(self, req) -> None:
        """`cache_unfinished_req` with the extra buffer: with a tracked state
        (`_tracked_checkpoint`) in the slot the pair donates (its latest), its tokens go in with
        that slot, donated (a fresh slot, one state evicted if none is free, takes its place in
        the pair); the request then shares the tree's KV for them and its lock moves to their
        node. Otherwise nothing goes in. Either way the tracked lengths are forgotten, and
        `prefix_indices` spells all of `fill_ids`."""
        token_ids = req.fill_ids if type(req.fill_ids) is list else list(req.fill_ids)
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(token_ids)]
        picked = self._tracked_checkpoint(req, len(token_ids))
        req.mamba_last_track_seqlen = req.mamba_prev_track_seqlen = None
        pool, mamba_pool = self.req_to_token_pool, self.req_to_token_pool.mamba_pool
        if picked is None or picked[1] != pool.get_mamba_ping_pong_keep_idx(req):
            req.prefix_indices = row.to(dtype=torch.int64, copy=True)
            return
        length = picked[0]
        fresh = mamba_pool.alloc(1)
        if fresh is None:
            self.evict_mamba(1)
            fresh = mamba_pool.alloc(1)
            if fresh is None:
                raise MambaPoolExhaustedError(
                    f"cache_unfinished_req: no Mamba slot for request {req.rid!r}'s track buffer even "
                    f"after evicting (pool of {mamba_pool.size}, all states locked)"
                )
        donated = pool.donate_mamba_ping_pong_slot(req, fresh).reshape(1).to(torch.int64, copy=True)
        value = row[:length].to(dtype=torch.int64, copy=True)
        prefix_len = req.prefix_indices.shape[0]
        new_prefix_len, mamba_exist, new_last_node, split = self._insert_helper(
            RadixKey._trusted(token_ids[:length], req.extra_key), value, donated
        )
        if new_prefix_len > prefix_len:
            self.token_to_kv_pool_allocator.free(row[prefix_len:new_prefix_len])
        if mamba_exist:
            mamba_pool.free(donated)
        if split:
            self._refresh_path(self._path_from(new_last_node))
        new_indices = torch.cat([node.value for node in reversed(self._path_from(new_last_node))])
        if new_prefix_len > prefix_len:
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(prefix_len, new_prefix_len)), new_indices[prefix_len:new_prefix_len]
            )
        self.inc_lock_ref(new_last_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices = torch.cat([new_indices, row[len(new_indices):].to(torch.int64)])
        req.last_node = new_last_node

    def evict(self, full_num_tokens: int) -> None:
        """Free at least `full_num_tokens` KV slots (if that many are evictable).

        Evicts least recently used unlocked leaves, each with every tombstone ancestor that it
        leaves as an unlocked leaf, until enough tokens are freed.
        """
        full_num_tokens = _count(full_num_tokens, "evict")
        if self.disable or full_num_tokens == 0:
            return
        kv_freed: List[torch.Tensor] = []
        mamba_freed: List[torch.Tensor] = []
        evicted = 0
        while evicted < full_num_tokens:
            leaf = self.full_lru_list.pop_lru_evictable()
            if leaf is None:
                break
            evicted += self._evict_leaf(leaf, kv_freed, mamba_freed)
        self._free_batched(kv_freed, mamba_freed)

    def evict_mamba(self, mamba_num: int) -> None:
        """Free at least `mamba_num` Mamba states (if that many are evictable).

        Takes the least recently used Mamba holder whose state is unlocked: an internal node
        becomes a tombstone; a leaf is evicted whole, with its tombstone ancestors.
        """
        mamba_num = _count(mamba_num, "evict_mamba")
        if self.disable or mamba_num == 0:
            return
        kv_freed: List[torch.Tensor] = []
        mamba_freed: List[torch.Tensor] = []
        evicted = 0
        while evicted < mamba_num:
            node = self.mamba_lru_list.pop_lru_evictable()
            if node is None:
                break
            if node.children:
                mamba_freed.append(node.mamba_value)
                self.mamba_lru_list.remove(node)
                self.mamba_evictable_size_ -= node.mamba_value.numel()
                node.mamba_value = None
            else:
                self._evict_leaf(node, kv_freed, mamba_freed)
            evicted += 1
        self._free_batched(kv_freed, mamba_freed)

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock `node`'s KV and that of its ancestors, and `node`'s own Mamba state if it has one."""
        if self.disable:
            return None
        self._check_live(node, "inc_lock_ref")
        if node.mamba_value is not None:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size_ -= node.mamba_value.numel()
                self.mamba_protected_size_ += node.mamba_value.numel()
            node.mamba_lock_ref += 1
        while node is not self.root_node:
            if node.full_lock_ref == 0:
                self.full_evictable_size_ -= node.value.numel()
                self.full_protected_size_ += node.value.numel()
            node.full_lock_ref += 1
            node = node.parent
        return None

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`; refused (nothing changes) if `node` is not locked."""
        if self.disable:
            return
        self._check_live(node, "dec_lock_ref")
        if node.mamba_value is not None and node.mamba_lock_ref <= 0:
            raise CacheMisuseError(
                f"dec_lock_ref on node {node.id} whose Mamba state is not locked "
                f"(mamba_lock_ref={node.mamba_lock_ref})"
            )
        walker = node
        while walker is not self.root_node:
            if walker.full_lock_ref <= 0:
                raise CacheMisuseError(
                    f"dec_lock_ref on node {node.id}: node {walker.id} on its path is not locked "
                    f"(full_lock_ref={walker.full_lock_ref})"
                )
            walker = walker.parent

        if node.mamba_value is not None:
            if node.mamba_lock_ref == 1:
                self.mamba_evictable_size_ += node.mamba_value.numel()
                self.mamba_protected_size_ -= node.mamba_value.numel()
            node.mamba_lock_ref -= 1
            if node.mamba_lock_ref == 0:
                self.mamba_lru_list.note_maybe_evictable(node)
        while node is not self.root_node:
            if node.full_lock_ref == 1:
                self.full_evictable_size_ += node.value.numel()
                self.full_protected_size_ -= node.value.numel()
            node.full_lock_ref -= 1
            if node.full_lock_ref == 0:
                self.full_lru_list.note_maybe_evictable(node)
            node = node.parent

    def evictable_size(self) -> Tuple[int, int]:
        raise NotImplementedError("use full_evictable_size() and mamba_evictable_size()")

    def protected_size(self) -> Tuple[int, int]:
        raise NotImplementedError("use full_protected_size() and mamba_protected_size()")

    def full_evictable_size(self) -> int:
        """KV tokens in unlocked nodes."""
        return self.full_evictable_size_

    def mamba_evictable_size(self) -> int:
        """Mamba states in nodes whose state is unlocked."""
        return self.mamba_evictable_size_

    def full_protected_size(self) -> int:
        """KV tokens in locked nodes."""
        return self.full_protected_size_

    def mamba_protected_size(self) -> int:
        """Mamba states in nodes whose state is locked."""
        return self.mamba_protected_size_

    def total_size(self) -> Tuple[int, int]:
        """(KV tokens, Mamba states) held by the tree."""
        return (
            self.full_evictable_size_ + self.full_protected_size_,
            self.mamba_evictable_size_ + self.mamba_protected_size_,
        )

    def all_values_flatten(self) -> torch.Tensor:
        """Every KV slot the tree holds, in depth-first order."""
        values = [node.value for node in self._iter_nodes() if node is not self.root_node]
        return torch.cat(values) if values else self._empty_indices()

    def sanity_check(self) -> None:
        """Check the tree against its LRU lists and size counters (O(tree); for debugging).

        Raises `CacheInvariantError` naming the first inconsistency.
        """
        nodes = [node for node in self._iter_nodes() if node is not self.root_node]
        holders = [node for node in nodes if node.mamba_value is not None]
        for node in nodes:
            if not node.children and node.mamba_value is None:
                raise CacheInvariantError(f"leaf node {node.id} is a tombstone")
            if node.full_lock_ref > 0 and node.parent is not self.root_node and node.parent.full_lock_ref == 0:
                raise CacheInvariantError(f"node {node.id} is locked but its parent {node.parent.id} is not")
            if node.mamba_lock_ref > node.full_lock_ref or min(node.full_lock_ref, node.mamba_lock_ref) < 0:
                raise CacheInvariantError(
                    f"node {node.id} has full_lock_ref={node.full_lock_ref}, mamba_lock_ref={node.mamba_lock_ref}"
                )
        for lru, members in ((self.full_lru_list, nodes), (self.mamba_lru_list, holders)):
            listed = list(lru.iter_mru_to_lru())
            if not lru.links_consistent() or {id(n) for n in listed} != {id(n) for n in members} or len(listed) != len(members):
                raise CacheInvariantError(f"{lru.name} LRU list does not hold exactly its {len(members)} nodes")
        expected = (
            sum(len(n.value) for n in nodes if n.full_lock_ref == 0),
            sum(len(n.value) for n in nodes if n.full_lock_ref > 0),
            sum(1 for n in holders if n.mamba_lock_ref == 0),
            sum(1 for n in holders if n.mamba_lock_ref > 0),
        )
        actual = (
            self.full_evictable_size_,
            self.full_protected_size_,
            self.mamba_evictable_size_,
            self.mamba_protected_size_,
        )
        if expected != actual:
            raise CacheInvariantError(
                f"size counters (full evictable, full protected, mamba evictable, mamba protected) "
                f"are {actual}, the tree says {expected}"
            )

    def format_tree(self) -> str:
        """The tree, one indented line per node: id, tokens, Mamba slot, locks, LRU positions."""
        full_rank = {id(n): i for i, n in enumerate(self.full_lru_list.iter_mru_to_lru())}
        mamba_rank = {id(n): i for i, n in enumerate(self.mamba_lru_list.iter_mru_to_lru())}
        lines = []
        stack = [(self.root_node, 0)]
        while stack:
            node, depth = stack.pop()
            mamba = "tombstone" if node.mamba_value is None else f"mamba={int(node.mamba_value[0])}"
            tokens = node.key.token_ids
            shown = tokens if len(tokens) <= 8 else tokens[:8] + ["..."]
            lines.append(
                f"{'  ' * depth}[{node.id}] tokens={shown} {mamba} "
                f"lock={node.full_lock_ref}/{node.mamba_lock_ref} "
                f"lru={full_rank.get(id(node), '-')}/{mamba_rank.get(id(node), '-')}"
            )
            for child in reversed(list(node.children.values())):
                stack.append((child, depth + 1))
        total, mamba_total = self.total_size()
        lines.append(f"#full_tokens: {total}, #mamba_num: {mamba_total}")
        return "\n".join(lines)

    def pretty_print(self) -> None:
        """Print `format_tree()`."""
        print(self.format_tree())

    # ----- internals --------------------------------------------------------------------------

    def _whole_pages(self, n: int) -> int:
        """`n` tokens cut down to whole pages."""
        return n - n % self.page_size

    def _empty_indices(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64, device=self.device)

    @staticmethod
    def _check_key(key) -> None:
        if not isinstance(key, RadixKey):
            raise CacheMisuseError(f"expected a RadixKey, got {type(key).__name__}: {key!r}")

    def _check_live(self, node, method: str) -> None:
        if not isinstance(node, TreeNode) or not node.in_tree:
            raise CacheMisuseError(f"{method} on a node that is not in the tree: {node!r}")

    def _check_req(self, req, method: str) -> None:
        if req.req_pool_idx is None:
            raise CacheMisuseError(f"{method}: request {req.rid!r} has no request slot")
        if not self.disable:
            self._check_live(req.last_node, method)
            if req.last_node is not self.root_node and req.last_node.full_lock_ref <= 0:
                raise CacheMisuseError(
                    f"{method}: request {req.rid!r} does not hold a lock on its last node "
                    f"{req.last_node.id}"
                )

    def _req_mamba_slot(self, req) -> torch.Tensor:
        """The request's own Mamba slot, shape [1], as its request slot maps it (int32)."""
        return self.req_to_token_pool.get_mamba_indices(slice(req.req_pool_idx, req.req_pool_idx + 1))

    def _iter_nodes(self):
        stack = [self.root_node]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _copy_mamba_to_req(self, node: TreeNode, req) -> None:
        mamba_pool = self.req_to_token_pool.mamba_pool
        if req.mamba_pool_idx is not None:
            mamba_pool.copy_from(node.mamba_value, req.mamba_pool_idx.reshape(1))
            return
        dst = mamba_pool.alloc(1)
        if dst is None:
            # the seed locks the node (inc_lock_ref) around this eviction; locking its state alone
            # protects the same: its ancestors have a child, so no eviction can reach them
            node.mamba_lock_ref += 1
            try:
                self.evict_mamba(1)
            finally:
                node.mamba_lock_ref -= 1
                self.mamba_lru_list.note_maybe_evictable(node)
            dst = mamba_pool.alloc(1)
            if dst is None:
                raise MambaPoolExhaustedError(
                    f"match_prefix(cow_mamba=True): no Mamba slot for request {req.rid!r} even "
                    f"after evicting (pool of {mamba_pool.size}, all states locked)"
                )
        mamba_pool.copy_from(node.mamba_value, dst)
        req.mamba_pool_idx = dst[0]

    def _match_prefix_helper(self, key: RadixKey) -> Tuple[List[torch.Tensor], TreeNode]:
        ps = self.page_size
        tokens, extra, end = key.token_ids, key.extra_key, self._whole_pages(len(key))
        node = self.root_node
        value: List[torch.Tensor] = []
        best_value_len = 0
        best_node = node
        pos = 0  # tokens[:pos] are matched; walking by position, no key is sliced
        while pos < end:
            child = node.children.get(child_key_at(tokens, pos, extra, ps))
            if child is None:
                break
            if node.mamba_value is not None:
                best_value_len, best_node = len(value), node
            prefix_len = shared_pages(child.key.token_ids, tokens, pos, ps)
            if prefix_len < len(child.key):
                node = self._split_node(child, prefix_len)
                value.append(node.value)
                break
            value.append(child.value)
            node = child
            pos += prefix_len
        if node.mamba_value is not None:
            best_value_len, best_node = len(value), node

        self._refresh_path(self._path_from(best_node))
        return value[:best_value_len], best_node

    def _path_from(self, node: TreeNode) -> List[TreeNode]:
        """`node` and its ancestors up to (without) the root, `node` first."""
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        return path

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut `child` after `split_len` tokens; the new upper node is a tombstone."""
        parent = child.parent
        upper = TreeNode(next(self._node_ids), child.key[:split_len], child.value[:split_len], parent)
        upper.full_lock_ref = child.full_lock_ref
        lower_key = child.key[split_len:]
        upper.children[child_key(lower_key, self.page_size)] = child
        parent.children[child_key(child.key, self.page_size)] = upper
        child.parent = upper
        child.key = lower_key
        child.value = child.value[split_len:]
        self.full_lru_list.insert_mru(upper)
        self.full_lru_list.reset_mru(child)
        if child.mamba_value is not None:
            self.mamba_lru_list.reset_mru(child)
        return upper

    def _refresh_path(self, path: List[TreeNode]) -> None:
        """Make `path` (a node first, then its ancestors) most recently used in both lists, the
        node ahead of its parents; the Mamba list holds only the path's Mamba holders."""
        self.full_lru_list.reset_path_mru(path)
        self.mamba_lru_list.reset_path_mru([n for n in path if n.mamba_value is not None])

    def _insert_helper(
        self, key: RadixKey, value: torch.Tensor, mamba_value
    ) -> Tuple[int, bool, TreeNode, bool]:
        """`insert`'s `(prefix_len, mamba_exist)`, the node where `key` now ends, and whether a
        node was split on the way. A key is cut to whole pages (the caller keeps the rest)."""
        ps = self.page_size
        tokens, extra, end = key.token_ids, key.extra_key, self._whole_pages(len(key))
        if end == 0:
            return 0, True, self.root_node, False
        node = self.root_node
        pos = 0  # tokens[:pos] are in the tree along the path walked so far
        walked: List[TreeNode] = []
        split_len = 0  # > 0 when the walk ends inside its last node, which must be split there
        while pos < end:
            child = node.children.get(child_key_at(tokens, pos, extra, ps))
            if child is None:
                break
            walked.append(child)
            prefix_len = shared_pages(child.key.token_ids, tokens, pos, ps)
            pos += prefix_len
            if prefix_len < len(child.key):
                split_len = prefix_len
                break
            node = child
        # every node walked is refreshed, the deepest ahead, before the split (which always ends
        # the walk) puts the new upper node and then the lower one at the head
        walked.reverse()
        self._refresh_path(walked)
        if split_len:
            node = self._split_node(walked[0], split_len)

        if pos < end:
            leaf_key = RadixKey._trusted(tokens[pos:end], extra)
            leaf = TreeNode(next(self._node_ids), leaf_key, value[pos:end], node)
            leaf.mamba_value = mamba_value
            node.children[child_key(leaf_key, ps)] = leaf
            self.full_evictable_size_ += leaf.value.numel()
            self.mamba_evictable_size_ += mamba_value.numel()
            self.full_lru_list.insert_mru(leaf)
            self.mamba_lru_list.insert_mru(leaf)
            return pos, False, leaf, split_len > 0
        if node.mamba_value is None:
            node.mamba_value = mamba_value
            self.mamba_evictable_size_ += mamba_value.numel()
            self.mamba_lru_list.insert_mru(node)
            return pos, False, node, split_len > 0
        self.mamba_lru_list.reset_mru(node)
        return pos, True, node, split_len > 0

    def _evict_leaf(self, leaf: TreeNode, kv_freed: list, mamba_freed: list) -> int:
        """Remove an unlocked leaf and the tombstone ancestors it leaves as unlocked leaves.

        Queues their slots on `kv_freed` / `mamba_freed`; returns the KV tokens removed.
        """
        if leaf.full_lock_ref or leaf.mamba_lock_ref or leaf.mamba_value is None or leaf.children:
            raise CacheInvariantError(f"evicting {leaf!r}, which is not an unlocked Mamba leaf")
        mamba_freed.append(leaf.mamba_value)
        self.mamba_lru_list.remove(leaf)
        self.mamba_evictable_size_ -= leaf.mamba_value.numel()
        evicted = self._delete_node(leaf, kv_freed)
        parent = leaf.parent
        while (
            parent is not self.root_node
            and not parent.children
            and parent.mamba_value is None
            and parent.full_lock_ref == 0
        ):
            grandparent = parent.parent
            evicted += self._delete_node(parent, kv_freed)
            parent = grandparent
        if parent is not self.root_node and not parent.children:
            self.full_lru_list.note_maybe_evictable(parent)
        return evicted

    def _delete_node(self, node: TreeNode, kv_freed: list) -> int:
        """Detach an unlocked childless node (its Mamba state already gone); queue its KV slots."""
        del node.parent.children[child_key(node.key, self.page_size)]
        node.in_tree = False
        self.full_lru_list.remove(node)
        self.full_evictable_size_ -= node.value.numel()
        kv_freed.append(node.value)
        return node.value.numel()

    def _free_batched(self, kv_freed: List[torch.Tensor], mamba_freed: List[torch.Tensor]) -> None:
        if kv_freed:
            self.token_to_kv_pool_allocator.free(kv_freed[0] if len(kv_freed) == 1 else torch.cat(kv_freed))
        if mamba_freed:
            mamba_pool = self.req_to_token_pool.mamba_pool
            mamba_pool.free(mamba_freed[0] if len(mamba_freed) == 1 else torch.cat(mamba_freed))
