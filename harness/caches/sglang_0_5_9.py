"""`Sglang059Cache`: `MambaRadixCache` of the params era (0.5.9 .. 0.5.12.post1) as a cache under
test.

What changed from the init-params era (`Sglang056Cache`), read from the wheels:
  0.5.9   `insert(InsertParams)` answers an `InsertResult`; `evict(EvictParams)`; the request pool
          hands out and takes back slots through the requests (`alloc(reqs)`, which keeps the row
          a request already holds, `free(req)`, `free_mamba_cache(req)`); `cache_finished_req`
          no longer frees the request slot: the scheduler's `release_kv_cache`
          (`mem_cache/common.py`) frees it after the call
Mamba slots still come from the `MambaPool` (`fork_from` for copy-on-write).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from harness.caches.sglang_0_5_6 import Sglang056Cache


class Sglang059Cache(Sglang056Cache):
    """`MambaRadixCache` of 0.5.9 .. 0.5.12.post1 with SGLang's pools (see the module docstring)."""

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        result = self.cache.insert(self.sgl.InsertParams(key=key, value=kv, mamba_value=mamba))
        return result.prefix_len, result.mamba_exist

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens))

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """`release_kv_cache(req, tree_cache, is_insert)`: the tree takes (or frees) what the
        request computed, then the request slot goes back."""
        self.cache.cache_finished_req(req, is_insert=is_insert)
        self.req_pool.free(req)

    def req_alloc(self, reqs: Sequence[Any]) -> Optional[List[int]]:
        return self.req_pool.alloc(list(reqs))

    def req_free(self, req: Any, free_mamba_cache: bool = True) -> None:
        """The request slot goes back (`req_to_token_pool.free(req)`), its Mamba slot too unless
        told otherwise (`free_mamba_cache(req)` first)."""
        if free_mamba_cache:
            self.req_pool.free_mamba_cache(req)
        self.req_pool.free(req)
