"""`SglangUnified0517Cache`: the `UnifiedRadixCache` (Full + Mamba) of 0.5.17 and 0.5.18, the cache
their schedulers build for hybrid Mamba models, as a cache under test.

Its calls are 0.5.20's (`harness.caches.sglang_unified_0_5_20`). What differs is where a request
keeps its slots: on itself (`req.req_pool_idx`, `req.mamba_pool_idx`, `req.kv_committed_len`,
`req.cache_protected_len`), with `req.kv` a `ReqKvInfo(kv_allocated_len, swa_evicted_seqlen)` that
`alloc_for_extend` creates the first time a request gets KV and `release_kv_cache` drops. The tree
has the Python core alone (no `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` yet), and the scheduler's
evictions (`evict_from_tree_cache`, the Mamba shortfall in `alloc_req_slots`) call `evict`
(`evict_for_alloc` came in 0.5.19).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.caches.sglang_unified_0_5_20 import SglangUnified0520Cache


class SglangUnified0517Cache(SglangUnified0520Cache):
    """0.5.17's and 0.5.18's `UnifiedRadixCache` (see the module docstring)."""

    def slots_of(self, req: Any) -> Any:
        return req

    def allocated_len_of(self, req: Any) -> int:
        return 0 if req.kv is None else req.kv.kv_allocated_len

    def kv_released(self, req: Any) -> bool:
        """`release_kv_cache` drops `req.kv` (a request that never got KV has none either)."""
        return req.kv is None

    def write_row(self, req: Any, start: int, slots: torch.Tensor) -> None:
        """The row is written and the request's KV committed up to its end; its allocated length
        goes in `req.kv`, created on the first extend as `alloc_for_extend` creates it."""
        end = start + slots.shape[0]
        self.req_pool.write((req.req_pool_idx, slice(start, end)), slots.to(self.req_pool.req_to_token.dtype))
        req.kv_committed_len = max(req.kv_committed_len, end)
        if req.kv is None:
            req.kv = self.sgl.ReqKvInfo(kv_allocated_len=end, swa_evicted_seqlen=0)
        else:
            req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, end)

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens))

    def evict_mamba(self, num: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=0, mamba_num=num))
