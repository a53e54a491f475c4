"""`ImplInSglangCache`: `impl`'s tree as the radix cache of SGLang's own scheduler (0.5.22 on),
registered as a radix cache backend (`--protocol scheduler` with `--impl impl`).

From 0.5.16 SGLang's scheduler talks to its tree through `BasePrefixCache` (0.5.23's
`mem_cache/base_prefix_cache.py`): `match_prefix(MatchPrefixParams)`, `lock` / `unlock`
receipts, `checkpoint(req, up_to)`, `evict_for_alloc(EvictParams)`, and leaves the request's
row and slots to `mem_cache/common.py` (`release_kv_cache`: `free_kv_row`, `on_release`,
`req_to_token_pool.free(req)`). `impl` keeps 0.5.4's API, so `ImplPrefixCache` speaks the new
one on top of impl's own tree operations, the pools SGLang's:

  match_prefix(params)     impl's `match_prefix` on the key up to its limit; with `cow_mamba`
                           impl copies the matched state into the request's Mamba slot (and
                           allocates it) at once, so nothing is left to the forward pass's
                           deferred copy-on-write
  touch_prefix(key)        impl's `match_prefix` (the walk refreshes the path)
  lock / unlock            impl's `inc_lock_ref` / `dec_lock_ref` of the node, a `TreeLock`
                           receipt
  checkpoint(req, up_to)   impl's own `cache_finished_req` for a finished request (the tree
                           takes its Mamba slot and releases its lock; the scheduler's release
                           then frees none of the KV slots the tree took), else its
                           `cache_unfinished_req` (a fork of the state; the lock moves down),
                           each on a view of the request in impl's `Req` fields; the request's
                           `kv` record left as `UnifiedRadixCache.checkpoint_into_tree` leaves it
                           (with the extra buffer the view carries the request's track buffer
                           and tracked lengths, impl's track-slot calls go to SGLang's pool on
                           the real request, and what the tree protects is the path to the
                           lock's node)
  on_release               a request not checkpointed gives its Mamba slot back
  evict / evict_for_alloc  impl's `evict(num_tokens)` then `evict_mamba(mamba_num)`
  sizes, sanity_check      impl's own

What the model follows (`impl_in_sglang_rules`) is impl's own contract (`SGLANG_0_5_4`) with the
pools' switches of the SGLang release whose pools hand out the slots.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable, Optional, Tuple

import torch

import impl
from harness.caches.base import CacheUnderTest
from harness.caches.impl import class_impl_name, read_lru
from harness.caches.sglang_releases import unified_rules
from harness.caches.sglang_unified_0_5_22 import SglangUnified0522Cache
from reference import SGLANG_0_5_4, Rules
from strategies.config import PAGE_SIZES, CacheConfig

# the releases whose tree-cache interface `ImplPrefixCache` speaks (0.5.21 and before: 0.5.20's
# `inc_lock_ref` receipts, `cache_unfinished_req`, `insert_req`, `unpin`)
SPEAKS = ("0.5.22", "0.5.23")
# the switches of `Rules` that are the pools' (which slot comes first, from which end), not the tree's
POOL_SWITCHES = ("first_mamba_slot", "first_req_slot", "req_slots_from_tail")


def impl_in_sglang_rules(version: str) -> Rules:
    """impl's contract over SGLang `version`'s pools."""
    pools = unified_rules(version)
    return replace(SGLANG_0_5_4, name=f"impl-in-sglang-{version}", **{switch: getattr(pools, switch) for switch in POOL_SWITCHES})


class MambaSlotsForImpl:
    """What impl's tree calls on its Mamba pool, made on SGLang's: slots from the request pool's
    Mamba allocator, states copied in its Mamba pool (slot ids translated as SGLang does)."""

    def __init__(self, req_pool: Any):
        self._req_pool = req_pool

    @property
    def size(self) -> int:
        return self._req_pool.mamba_allocator.size

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        return self._req_pool.mamba_allocator.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self._req_pool.mamba_allocator.free(slots)

    def copy_from(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        translate = self._req_pool.translate_mamba_indices
        self._req_pool.mamba_pool.copy_from(translate(src.reshape(-1)), translate(dst.reshape(-1)))

    def fork_from(self, src: torch.Tensor) -> Optional[torch.Tensor]:
        """A fresh slot holding a copy of `src`'s state (None when none is free)."""
        dst = self.alloc(1)
        if dst is not None:
            self.copy_from(src, dst)
        return dst


@functools.lru_cache(maxsize=None)
def prefix_cache_class() -> type:
    """`ImplPrefixCache`, a subclass of the installed SGLang's `BasePrefixCache` (built once
    SGLang is importable)."""
    from sglang.srt.mem_cache.base_prefix_cache import (
        BasePrefixCache,
        DecLockRefParams,
        EvictResult,
        IncLockRefResult,
        MatchResult,
        TreeLock,
    )

    class ImplPrefixCache(BasePrefixCache):
        """impl's tree behind the tree-cache interface of SGLang's scheduler (see the module
        docstring). Node handles are impl's `TreeNode`s."""

        def __init__(self, tree: impl.MambaRadixCache, req_to_token_pool: Any, token_to_kv_pool_allocator: Any, page_size: int):
            self.tree = tree
            self.req_to_token_pool = req_to_token_pool
            self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
            self.page_size = page_size
            self.disable = False
            self.pools = tree.req_to_token_pool
            self.mamba_slots = self.pools.mamba_pool

        # ----- nodes ------------------------------------------------------------------------

        @property
        def root_node(self) -> Any:
            return self.tree.root_node

        def root_node_handle(self, extra_key: Optional[str] = None) -> Any:
            return self.tree.root_node

        def resolve_node_handle(self, node_handle: Any) -> Any:
            return node_handle

        def is_root(self, node: Any) -> bool:
            return node is self.tree.root_node

        def path_device_indices(self, node: Any) -> torch.Tensor:
            """The KV slots of every token from the root to `node`."""
            values = []
            while node is not None and node is not self.tree.root_node:
                values.append(node.value)
                node = node.parent
            return torch.cat(values[::-1]) if values else self.tree._empty_indices()

        # ----- matching ---------------------------------------------------------------------

        def match_prefix(self, params: Any) -> Any:
            key = _impl_key(params.key)
            req = params.req
            if params.cow_mamba and req is not None:
                holder = _MambaHolder(req)
                result = self.tree.match_prefix(key, cow_mamba=True, req=holder)
                req.kv.mamba_pool_idx = holder.mamba_pool_idx
                # the copy is made: the forward pass has none to make, and no fresh slot to clear
                req.kv.mamba_cow_src_index = None
                req.kv.mamba_needs_clear = False
            else:
                result = self.tree.match_prefix(key)
            node = result.last_device_node
            return MatchResult(
                device_prefix_len=len(result.device_indices), last_device_node=node,
                last_host_node=node, best_match_node=node,
            )

        def touch_prefix(self, key: Any) -> None:
            self.tree.match_prefix(_impl_key(key))

        # ----- locks ------------------------------------------------------------------------

        def inc_lock_ref(self, node: Any, skip_lock_components: Tuple = ()) -> Any:
            self.tree.inc_lock_ref(node)
            return IncLockRefResult()

        def dec_lock_ref(self, node: Any, params: Any = None, skip_swa: bool = False) -> Any:
            self.tree.dec_lock_ref(node)

        def lock(self, node: Any, skip_lock_components: Tuple = ()) -> Any:
            self.tree.inc_lock_ref(node)
            return TreeLock(node, DecLockRefParams())

        def unlock(self, lock: Any) -> None:
            if lock is not None:
                self.tree.dec_lock_ref(lock.node)

        # ----- caching a request ------------------------------------------------------------

        def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
            """impl's caching of the request's first `up_to` tokens: `cache_finished_req` for a
            finished request (the tree takes its Mamba slot, and its lock is released: the
            scheduler's release then frees no KV slot the tree took), else
            `cache_unfinished_req` (the tree takes a fork of its state; its lock moves to the
            node the tokens end at). The request's `kv` record follows as
            `UnifiedRadixCache.checkpoint_into_tree` leaves it."""
            kv = req.kv
            tokens = list(req.full_untruncated_fill_ids[:up_to])
            if not tokens:
                return
            lock, prompt = req.lock, min(len(req.origin_input_ids), len(tokens))
            view = impl.Req(req.rid, tokens[:prompt], req.extra_key)
            # impl's finishing inserts input and output but the last output token, which has
            # no KV yet: the tokens up to `up_to`, then the one after (any, were there none)
            view.output_ids = tokens[prompt:] + (list(req.full_untruncated_fill_ids[len(tokens) : len(tokens) + 1]) or [0])
            view.fill_ids = tokens
            view.req_pool_idx = kv.req_pool_idx
            view.prefix_indices = self.req_to_token_pool.req_to_token[kv.req_pool_idx, : kv.cache_protected_len].to(torch.int64, copy=True)
            view.last_node = self.tree.root_node if lock is None else lock.node
            if self.tree.enable_mamba_extra_buffer:
                view.mamba_ping_pong_track_buffer = kv.mamba_ping_pong_track_buffer
                view.mamba_last_track_seqlen = kv.mamba_last_track_seqlen
                view.mamba_prev_track_seqlen = kv.mamba_prev_track_seqlen
            self.pools.releasing = req
            try:
                if req.finished():
                    self.tree.cache_finished_req(view)
                    req.lock = None
                    kv.cache_protected_len = len(tokens)
                else:
                    self.tree.cache_unfinished_req(view)
                    req.lock = TreeLock(view.last_node, DecLockRefParams())
                    req.last_node = view.last_node
                    # what the tree protects: the path to the node the lock is on
                    kv.cache_protected_len = len(self.path_device_indices(view.last_node))
            finally:
                self.pools.releasing = None
            if self.tree.enable_mamba_extra_buffer:
                kv.mamba_last_track_seqlen = view.mamba_last_track_seqlen
                kv.mamba_prev_track_seqlen = view.mamba_prev_track_seqlen
            kv.cache_inserted_len = max(kv.cache_inserted_len, len(tokens))

        def on_release(self, req: Any, *, checkpointed: bool) -> None:
            """A request released without a checkpoint gives its Mamba slot back."""
            if not checkpointed and req.kv.holds_mamba:
                self.req_to_token_pool.free_mamba_cache(req)

        def claim_kv_row(self, req: Any) -> bool:
            return False

        # ----- eviction ---------------------------------------------------------------------

        def evict(self, params: Any) -> Any:
            return self._evict(params)

        def evict_for_alloc(self, params: Any, *, allocation_reclaim_satisfied: Optional[Callable[[], bool]] = None) -> Any:
            return self._evict(params)

        def _evict(self, params: Any) -> Any:
            kv_before = self.token_to_kv_pool_allocator.available_size()
            mamba_before = self.req_to_token_pool.mamba_allocator.available_size()
            self.tree.evict(params.num_tokens)
            self.tree.evict_mamba(params.mamba_num or 0)
            return EvictResult(
                num_tokens_evicted=self.token_to_kv_pool_allocator.available_size() - kv_before,
                mamba_num_evicted=self.req_to_token_pool.mamba_allocator.available_size() - mamba_before,
            )

        def reset(self) -> None:
            self.tree.reset()

        # ----- sizes and self-checks ----------------------------------------------------------

        def evictable_size(self) -> int:
            return self.tree.full_evictable_size()

        def full_evictable_size(self) -> int:
            return self.tree.full_evictable_size()

        def mamba_evictable_size(self) -> int:
            return self.tree.mamba_evictable_size()

        def protected_size(self) -> int:
            return self.tree.full_protected_size()

        def full_protected_size(self) -> int:
            return self.tree.full_protected_size()

        def mamba_protected_size(self) -> int:
            return self.tree.mamba_protected_size()

        def total_size(self) -> Any:
            return self.tree.total_size()

        def all_values_flatten(self) -> torch.Tensor:
            return self.tree.all_values_flatten()

        def sanity_check(self) -> None:
            self.tree.sanity_check()

        def pretty_print(self) -> None:
            self.tree.pretty_print()

        def supports_mamba(self) -> bool:
            return True

    return ImplPrefixCache


class _MambaHolder:
    """The request as impl's copy-on-write sees it: no request slot yet, its Mamba slot."""

    def __init__(self, req: Any):
        self.rid = req.rid
        self.req_pool_idx = None
        self.mamba_pool_idx = req.kv.mamba_pool_idx


def _impl_key(key: Any) -> impl.RadixKey:
    """impl's key for SGLang's `RadixKey`: its tokens up to its limit (`len(key)`)."""
    return impl.RadixKey(list(key.token_ids[: len(key)]), key.extra_key)


class ImplInSglangCache(SglangUnified0522Cache):
    """impl's tree (or a subclass of its cache: a planted bug) as SGLang's scheduler's radix
    cache, over SGLang's pools (see the module docstring); read as impl's tree is read."""

    name = "impl"
    release = impl.__version__
    default_protocol = "scheduler"
    protocols = ("scheduler",)
    settings_taken = {"mamba_strategy": ("no_buffer", "extra_buffer"), "page_size": PAGE_SIZES}
    misuse_error = impl.CacheMisuseError
    mamba_exhausted_error = impl.MambaPoolExhaustedError
    sanity_check = CacheUnderTest.sanity_check
    snapshot = CacheUnderTest.snapshot
    path_of = CacheUnderTest.path_of
    node_object = CacheUnderTest.node_object
    in_tree = CacheUnderTest.in_tree

    def __init__(self, config: CacheConfig, cache_class: Callable[..., Any] = impl.MambaRadixCache):
        self._cache_class = cache_class
        super().__init__(config, tree_core="python")
        self.name = "impl" if cache_class is impl.MambaRadixCache else class_impl_name(cache_class)
        self.scheduler_release = self.release  # the SGLang release whose scheduler and pools it runs in
        self.release = impl.__version__

    @classmethod
    def release_rules(cls, version: str) -> Rules:
        return impl_in_sglang_rules(version)

    @classmethod
    def release_protocol(cls, version: str) -> str:
        return "scheduler"

    def _build_cache(self, config: CacheConfig) -> Any:
        pools = _ImplPools(self.req_pool)
        tree = self._cache_class(
            pools, self.kv, page_size=config.page_size, enable_mamba_extra_buffer=config.mamba_strategy == "extra_buffer"
        )
        return prefix_cache_class()(tree, self.req_pool, self.kv, config.page_size)

    @property
    def tree(self) -> Any:
        return self.cache.tree

    def _path_kv(self, node: Any) -> torch.Tensor:
        return self.cache.path_device_indices(node)

    def read_lru(self, which: str) -> Tuple[list, bool]:
        return read_lru(self.tree, which)

    def format_tree(self) -> str:
        return self.tree.format_tree()


class _ImplPools:
    """SGLang's request pool as impl's tree reaches it (0.5.4's calls): the rows, the Mamba
    pool, a request's Mamba slot; freeing a request slot is `release_kv_cache`'s business after
    the checkpoint, so `free` gives back only the Mamba slot of the request being checkpointed
    (`releasing`) when the tree did not take it."""

    def __init__(self, req_pool: Any):
        self._req_pool = req_pool
        self.req_to_token = req_pool.req_to_token
        self.mamba_pool = MambaSlotsForImpl(req_pool)
        self.releasing: Any = None

    def write(self, indices: Any, values: torch.Tensor) -> None:
        self._req_pool.write(indices, values)

    def get_mamba_indices(self, req_indices: Any) -> torch.Tensor:
        return self._req_pool.get_mamba_indices(req_indices)

    def free(self, req_pool_idx: int, free_mamba_cache: bool = True) -> None:
        if free_mamba_cache:
            self._req_pool.free_mamba_cache(self.releasing)

    # the extra buffer: the track-slot calls, on the request being checkpointed

    @property
    def mamba_ping_pong_track_buffer_size(self) -> int:
        return self._req_pool.mamba_ping_pong_track_buffer_size

    def get_mamba_ping_pong_keep_idx(self, req: Any) -> int:
        return self._req_pool.get_mamba_ping_pong_keep_idx(self.releasing)

    def get_mamba_ping_pong_other_idx(self, idx: int) -> int:
        return self._req_pool.get_mamba_ping_pong_other_idx(idx)

    def donate_mamba_ping_pong_slot(self, req: Any, new_slot: torch.Tensor) -> torch.Tensor:
        return self._req_pool.donate_mamba_ping_pong_slot(self.releasing, new_slot)

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: Optional[int] = None) -> None:
        self._req_pool.free_mamba_cache(self.releasing, mamba_ping_pong_track_buffer_to_keep=mamba_ping_pong_track_buffer_to_keep)
