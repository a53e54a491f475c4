"""`UnifiedScheduler`: the contract's calls as the scheduler of the unified-cache era makes them.

SGLang's scheduler for `UnifiedRadixCache` (0.5.23's `managers/scheduler.py`, `mem_cache/common.py`,
`mem_cache/allocation.py`) makes the contract's calls in its own forms (`harness.caches.
sglang_unified` translates each); where it makes different calls, this protocol follows it:

  between chunks        `stash_chunked_request` -> `checkpoint_kv_cache` only: the request being
                        chunked keeps its request row (and its Mamba slot) for its next chunk,
                        and `alloc_req_slots` reuses the row (`ReqToTokenPool.alloc`: "reqs that
                        already have a req_pool_idx ... will reuse their existing slot")
  evicting KV           `evict_from_tree_cache` -> `evict_to_free_tokens`: only the shortfall,
                        `evict_for_alloc(EvictParams(num_tokens=n - available))`
  Mamba slots           `ensure_mamba_capacity`: a slot for each request holding none, the
                        shortfall evicted (`evict_for_alloc(mamba_num=...)`)

Everything else is the contract protocol's (`harness.protocols.contract`), each of 0.5.4's
scheduler mistakes corrected as later releases corrected it.
"""

from __future__ import annotations

from typing import List

from harness.pairing import Request
from harness.protocols.contract import ContractScheduler


class UnifiedScheduler(ContractScheduler):
    """The contract protocol with the unified-cache era's chunk handling."""

    name = "unified"

    def free_chunked_slot(self, req: Request) -> None:
        """`stash_chunked_request`: the chunk is checkpointed (by the caller) and the request
        keeps its row."""
        self.on_event("chunked request keeps its row between chunks")

    def free_chunked_slot_disagg(self, req: Request) -> None:
        self.free_chunked_slot(req)

    def _ensure_mamba_slots(self, batch: List[Request]) -> None:
        """`ensure_mamba_capacity`: a Mamba slot for each request that holds none."""
        self._evict_mamba_shortfall(sum(self.caches.cut.mamba_slot_of(r.cut) is None for r in batch))

    def _evict_from_tree_cache(self, n: int) -> None:
        """`evict_to_free_tokens`: the tree gives up the shortfall, not all `n` tokens."""
        available = self.caches.kv_available()
        if available < n:
            self.caches.evict(n - available)
            self.on_event("KV allocation short: evicted, then retried")


MAMBA_STATE_PER_REQ_PREFIX_CACHE = 3  # 0.5.20's mem_cache/common.py


class Unified0520Scheduler(UnifiedScheduler):
    """0.5.20's scheduler for its `UnifiedRadixCache`: as `UnifiedScheduler`, but
    `alloc_req_slots` makes room for three Mamba states per request of the batch
    (`MAMBA_STATE_PER_REQ_PREFIX_CACHE`), held or not."""

    name = "unified-0.5.20"

    def _ensure_mamba_slots(self, batch: List[Request]) -> None:
        self._evict_mamba_shortfall(len(batch) * MAMBA_STATE_PER_REQ_PREFIX_CACHE)
