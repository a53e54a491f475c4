"""`SglangUnified0520Cache`: SGLang 0.5.20's `UnifiedRadixCache` (Full + Mamba), the cache 0.5.20's
scheduler builds for hybrid Mamba models (`mem_cache/registry.py`), as a cache under test.

It is built and read as `harness.caches.sglang_unified` builds and reads 0.5.23's; its calls are
0.5.20's, each as that release's scheduler helpers make it:
  a match                `match_prefix(MatchPrefixParams(...))`, whose result carries the prefix's
                         KV slots (`device_indices`), adopted as `req.prefix_indices`
  a request's lock       `req.lock_receipt = tree_cache.inc_lock_ref(req.last_node).to_dec_params()`
                         (`PrefillAdder._req_inc_lock_ref`), released with
                         `dec_lock_ref(req.last_node, req.lock_receipt)`
  caching a running one  `maybe_cache_unfinished_req` -> `cache_unfinished_req(req, chunked=...)`,
                         which matches the inserted key again to find the request's new node
  finishing, retracting  `release_kv_cache(req, tree_cache, is_insert)` (mem_cache/common.py)
The Mamba slots `alloc_req_slots` makes room for are 0.5.20's (`harness.protocols.unified`).
0.5.19 and 0.5.21 make the same calls (0.5.21's cache keeps them as wrappers over its new
`insert_req` / `on_release`), and so are driven by this adapter too.
"""

from __future__ import annotations

from typing import Any, List, Optional, Set

import torch

from harness.caches.sglang_unified import SglangUnifiedCache, UnifiedMatch
from reference import SGLANG_UNIFIED_0_5_20
from strategies.config import CacheConfig


class SglangUnified0520Cache(SglangUnifiedCache):
    """0.5.20's `UnifiedRadixCache` on one tree core (see the module docstring)."""

    rules = SGLANG_UNIFIED_0_5_20
    default_protocol = "unified-0.5.20"
    protocols = ("unified", "unified-0.5.20", "scheduler")  # the real scheduler: 0.5.19 .. 0.5.21 (`RELEASES`)

    def __init__(self, config: CacheConfig, tree_core: Optional[str] = None):
        super().__init__(config, tree_core)
        self._locked: Set[int] = set()  # the requests (by id()) holding their own lock

    def _refresh_fill_ids(self, req: Any) -> None:
        req._refresh_fill_ids()

    def _set_extend_end(self, req: Any, end: int) -> None:
        """`req.set_extend_range(prefix, end)`: the extend after the request's prefix."""
        req.set_extend_range(len(req.prefix_indices), end)

    def adopt_match(self, req: Any, match: UnifiedMatch) -> None:
        super().adopt_match(req, match)
        req.prefix_indices = match.device_indices

    def prefix_of(self, req: Any) -> List[int]:
        return req.prefix_indices.tolist()

    def match_prefix(self, key: Any, cow_mamba: bool = False, req: Any = None, **scheduler_args: Any) -> UnifiedMatch:
        result = self.cache.match_prefix(self.sgl.MatchPrefixParams(key=key, cow_mamba=cow_mamba, req=req))
        if req is not None:
            self.copy_deferred_cow(req)
        return UnifiedMatch(result.device_indices.to(torch.int64), result.last_device_node, result.last_host_node)

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """`maybe_cache_unfinished_req(req, tree_cache, chunked=...)`."""
        self.sgl.common.maybe_cache_unfinished_req(req, self.cache, chunked=chunked)

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """`release_kv_cache(req, tree_cache, is_insert)`."""
        if is_insert and not req.finished():
            req.finished_reason = self.sgl.FINISH_LENGTH(length=len(req.output_ids))
        self._release_extra_locks(req)
        self.sgl.common.release_kv_cache(req, self.cache, is_insert=is_insert)

    def lock_req(self, req: Any) -> None:
        """`_req_inc_lock_ref`: the receipt goes on the request; a second lock on the same
        request (the adder's temporary one) is kept beside it and released first. (The request's
        `lock_receipt` is never empty, so whether it holds its lock is the harness's to know.)"""
        receipt = self.cache.inc_lock_ref(req.last_node).to_dec_params()
        if id(req) in self._locked:
            self._extra_locks.setdefault(id(req), []).append((req.last_node, receipt))
        else:
            req.lock_receipt = receipt
            self._locked.add(id(req))

    def unlock_req(self, req: Any) -> None:
        extra = self._extra_locks.get(id(req))
        if extra:
            self.cache.dec_lock_ref(*extra.pop())
            return
        self.cache.dec_lock_ref(req.last_node, req.lock_receipt)
        self._locked.discard(id(req))

    def _release_extra_locks(self, req: Any) -> None:
        """Before the request is released (its own lock goes with it, in `cache_finished_req`)."""
        self._locked.discard(id(req))
        for node, receipt in self._extra_locks.pop(id(req), ()):
            self.cache.dec_lock_ref(node, receipt)

    def reset(self) -> None:
        super().reset()
        self._locked.clear()
