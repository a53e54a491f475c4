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
  checkpoint(req, up_to)   0.5.4's caching of a request (`cache_unfinished_req`, or for a finished
                           one the insert of `cache_finished_req`) in impl's `insert`, the KV
                           slots the tree already held freed by the caller, a running request's
                           node found by matching again; the request's `kv` record updated as
                           `UnifiedRadixCache.checkpoint_into_tree` updates it
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
from harness.caches.impl import read_lru
from harness.caches.sglang_releases import unified_rules
from harness.caches.sglang_unified import SglangUnifiedCache
from reference import SGLANG_0_5_4, Rules
from strategies.config import CacheConfig

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
            self.mamba_slots = tree.req_to_token_pool.mamba_pool

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
            """The tree takes the request's first `up_to` tokens (their KV slots from its row,
            its Mamba state: a fork for a running request, the request's own slot for a
            finished one); the row's tree-held part and the request's lock and node follow."""
            kv, tree = req.kv, self.tree
            finished = req.finished()
            tokens = list(req.full_untruncated_fill_ids[:up_to])
            if not tokens:
                return
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx, : len(tokens)].to(torch.int64, copy=True)
            state = kv.mamba_pool_idx.reshape(1).clone() if finished else self._fork_state(req)
            prefix_len, state_exists = tree.insert(impl.RadixKey(tokens, req.extra_key), row, state)
            # the tree already held these tokens' KV: the request's copies go back
            self.token_to_kv_pool_allocator.free(row[kv.cache_protected_len : prefix_len])
            kv.cache_inserted_len = max(kv.cache_inserted_len, len(tokens))
            if finished:
                if state_exists:
                    self.req_to_token_pool.free_mamba_cache(req)
                kv.cache_protected_len = len(tokens)
                return
            if state_exists:
                self.mamba_slots.free(state)
            found = tree.match_prefix(impl.RadixKey(tokens, req.extra_key))
            new_indices, node = found.device_indices, found.last_device_node
            self.req_to_token_pool.write((kv.req_pool_idx, slice(kv.cache_protected_len, len(new_indices))), new_indices[kv.cache_protected_len :])
            # the new lock first: the shared ancestors stay locked throughout
            old_lock, req.lock = req.lock, self.lock(node)
            self.unlock(old_lock)
            kv.cache_protected_len = len(new_indices)
            req.last_node = node

        def _fork_state(self, req: Any) -> torch.Tensor:
            """A copy of the running request's Mamba state in a fresh slot, one state evicted
            when none is free (`cache_unfinished_req`)."""
            forked = self.mamba_slots.fork_from(req.kv.mamba_pool_idx.reshape(1))
            if forked is None:
                self.tree.evict_mamba(1)
                forked = self.mamba_slots.fork_from(req.kv.mamba_pool_idx.reshape(1))
            if forked is None:
                raise impl.MambaPoolExhaustedError(
                    f"checkpoint(req {req.rid}): no Mamba slot for the tree's copy of its state even after "
                    f"evicting (pool of {self.mamba_slots.size}, all states locked)"
                )
            return forked

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


class ImplInSglangCache(SglangUnifiedCache):
    """impl's tree (or a subclass of its cache: a planted bug) as SGLang's scheduler's radix
    cache, over SGLang's pools (see the module docstring); read as impl's tree is read."""

    name = "impl"
    release = impl.__version__
    default_protocol = "scheduler"
    protocols = ("scheduler",)
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
        self.name = "impl" if cache_class is impl.MambaRadixCache else f"{cache_class.__module__}:{cache_class.__qualname__}"
        self.release = impl.__version__

    @classmethod
    def release_rules(cls, version: str) -> Rules:
        return impl_in_sglang_rules(version)

    @classmethod
    def release_protocol(cls, version: str) -> str:
        return "scheduler"

    def _build_cache(self, config: CacheConfig) -> Any:
        pools = _ImplPools(self.req_pool)
        tree = self._cache_class(pools, self.kv, page_size=config.page_size)
        return prefix_cache_class()(tree, self.req_pool, self.kv, config.page_size)

    @property
    def tree(self) -> Any:
        return self.cache.tree

    def _path_kv(self, node: Any) -> torch.Tensor:
        return self.cache.path_device_indices(node)

    def node_kv(self, node: Any) -> Tuple[int, ...]:
        return tuple(self._path_kv(node).tolist())

    def read_lru(self, which: str) -> Tuple[list, bool]:
        return read_lru(self.tree, which)

    def format_tree(self) -> str:
        return self.tree.format_tree()


class _ImplPools:
    """The request pool as impl's tree reaches it: only its Mamba pool."""

    def __init__(self, req_pool: Any):
        self.mamba_pool = MambaSlotsForImpl(req_pool)
