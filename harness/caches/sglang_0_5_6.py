"""`Sglang056Cache`: `MambaRadixCache` of the init-params era (0.5.6 .. 0.5.8.post1) as a cache
under test.

What changed from 0.5.4's API (`Sglang054Cache`), read from the wheels:
  0.5.6   the cache is built from `CacheInitParams`
  0.5.7   the request pool takes the Mamba extra buffer's arguments (left off here:
          `enable_mamba_extra_buffer=False`, `mamba_spec_state_size` the pool's size) and its
          `alloc(n, reqs)` needs the requests; the tree's failed self-check prints itself on
          tensor-parallel rank 0 (`get_tensor_model_parallel_rank`)
  0.5.8   `match_prefix(MatchPrefixParams(key=...))`
Everything else is 0.5.4's: `insert(key, value, mamba_value)`, `evict(n)`, Mamba slots from the
`MambaPool` (`fork_from` for copy-on-write), `req_to_token_pool.free(slot, free_mamba_cache)`.
These releases' schedulers are not transcribed (`docs/scheduler-protocol.md`); the cache runs
under the contract protocol.
"""

from __future__ import annotations

from typing import Any

from harness.caches.sglang_0_5_4 import Sglang054Cache
from harness.caches.sglang_loader import publish_server_args
from strategies.config import CacheConfig

TP_RANK = 0  # the single-GPU process the harness stands for


class Sglang056Cache(Sglang054Cache):
    """`MambaRadixCache` of 0.5.6 .. 0.5.8.post1 with SGLang's pools (see the module docstring)."""

    default_protocol = "contract"

    def _build_cache(self, config: CacheConfig) -> Any:
        publish_server_args(self.sgl)
        module = self.sgl.cache_module
        if hasattr(module, "get_tensor_model_parallel_rank"):  # 0.5.7 on: no process group here
            module.get_tensor_model_parallel_rank = lambda: TP_RANK
        return self.sgl.MambaRadixCache(
            self.sgl.CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.kv,
                page_size=config.page_size,
            )
        )

    def match_prefix(self, key: Any, cow_mamba: bool = False, req: Any = None, **scheduler_args: Any) -> Any:
        """0.5.8 on: `match_prefix(MatchPrefixParams(key, cow_mamba, req))` (the policy's own
        arguments have no place in it); before, 0.5.4's keywords."""
        if self.sgl.MatchPrefixParams is None:
            return super().match_prefix(key, cow_mamba=cow_mamba, req=req, **scheduler_args)
        return self.cache.match_prefix(self.sgl.MatchPrefixParams(key=key, cow_mamba=cow_mamba, req=req))
