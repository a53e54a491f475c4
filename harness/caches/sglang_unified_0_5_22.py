"""`SglangUnified0522Cache`: SGLang 0.5.22's and 0.5.23's `UnifiedRadixCache` (Full + Mamba), built
and read as `harness.caches.sglang_unified` builds and reads every era's.

Its calls are 0.5.23's (0.5.22 makes the same), each made as that release's scheduler helpers make it:
  a match                `match_kv_cache`: `match_prefix(MatchPrefixParams(key, cow_mamba, req))`,
                         the result adopted on the request; a copy-on-write is deferred to the
                         forward pass, which copies `mamba_cow_src_index` into the request's slot
  a request's lock       `req.lock = tree_cache.lock(req.last_node)` (a receipt, `TreeLock`),
                         released with `tree_cache.unlock(lock)`
  caching a running one  `checkpoint_kv_cache`: `checkpoint(req, up_to=req.extend_end)`
  finishing, retracting  `release_kv_cache(req, tree_cache, checkpoint=...)` (mem_cache/common.py)
  evicting KV            `evict_from_tree_cache` -> `evict_to_free_tokens`: `evict_for_alloc`
                         with the shortfall (the protocol computes it)
  Mamba slots            `ensure_mamba_capacity` (`evict_for_alloc(mamba_num=shortfall)`), then
                         `req_to_token_pool.alloc(reqs)`, which reuses the row a request holds
"""

from __future__ import annotations

from typing import Any, List

import torch

from harness.caches.sglang_unified import SglangUnifiedCache, UnifiedMatch


class SglangUnified0522Cache(SglangUnifiedCache):
    """0.5.22's and 0.5.23's `UnifiedRadixCache` on one tree core (see the module docstring)."""

    def _refresh_fill_ids(self, req: Any) -> None:
        """The request's fill ids are its input and output so far (`Req.refresh_fill_ids`)."""
        req.refresh_fill_ids()

    def _set_extend_end(self, req: Any, end: int) -> None:
        req.extend_end = end

    def prefix_of(self, req: Any) -> List[int]:
        if req.last_node is None or not req.prefix_len:
            return []
        return self.cache.prefix_device_indices(req).tolist()

    def match_prefix(self, key: Any, cow_mamba: bool = False, req: Any = None, **scheduler_args: Any) -> UnifiedMatch:
        """`match_prefix(MatchPrefixParams(key, cow_mamba, req))`; with copy-on-write the forward
        pass then makes the deferred copy into the request's slot. The policy's own arguments
        (`rid`) have no place in the parameters."""
        result = self.cache.match_prefix(self.sgl.MatchPrefixParams(key=key, cow_mamba=cow_mamba, req=req))
        if req is not None:
            self.copy_deferred_cow(req)
        node = result.last_device_node
        indices = self._path_kv(node)[: result.device_prefix_len].to(torch.int64)
        return UnifiedMatch(indices, node, result.last_host_node)

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """`checkpoint_kv_cache(req, tree_cache)`: the tree takes what the request computed up to
        its extend's end, and its lock moves to the node that insert ended on."""
        self.sgl.common.checkpoint_kv_cache(req, self.cache)

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """`release_kv_cache(req, tree_cache, checkpoint=is_insert)`; a request that goes into
        the tree is finished first (the tree reads `req.finished()`)."""
        if is_insert and not req.finished():
            req.finished_reason = self.sgl.FINISH_LENGTH(length=len(req.output_ids))
        self._release_extra_locks(req)
        self.sgl.common.release_kv_cache(req, self.cache, checkpoint=is_insert)

    def lock_req(self, req: Any) -> None:
        """`req.lock = tree_cache.lock(req.last_node)`; a second lock on the same request (the
        adder's temporary one) is kept beside it and released first."""
        lock = self.cache.lock(req.last_node)
        if req.lock is None:
            req.lock = lock
        else:
            self._extra_locks.setdefault(id(req), []).append(lock)

    def unlock_req(self, req: Any) -> None:
        extra = self._extra_locks.get(id(req))
        if extra:
            self.cache.unlock(extra.pop())
            return
        self.cache.unlock(req.lock)
        req.lock = None

    def _release_extra_locks(self, req: Any) -> None:
        for lock in self._extra_locks.pop(id(req), ()):
            self.cache.unlock(lock)
