"""`Sglang0513Cache`: `MambaRadixCache` of the mamba-allocator era (0.5.13 .. 0.5.18) as a cache
under test.

What changed from the params era (`Sglang059Cache`), read from the wheels:
  0.5.13  Mamba slots come from `req_to_token_pool.mamba_allocator` (the `MambaPool` keeps only
          the states); a copy-on-write match records the source state on the request
          (`mamba_cow_src_index`) and the forward pass copies it into the request's slot
  0.5.15  the process's server args live in the runtime context (`publish_server_args`)
  0.5.16  `cache_finished_req` takes the committed length to handle (`kv_len_to_handle`), which
          `release_kv_cache` reads from the request
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from harness.caches.sglang_0_5_9 import Sglang059Cache


class Sglang0513Cache(Sglang059Cache):
    """`MambaRadixCache` of 0.5.13 .. 0.5.18 with SGLang's pools (see the module docstring)."""

    def _mamba_slots(self) -> Any:
        return self.req_pool.mamba_allocator

    def match_prefix(self, key: Any, cow_mamba: bool = False, req: Any = None, **scheduler_args: Any) -> Any:
        """`match_prefix(MatchPrefixParams(key, cow_mamba, req))`, and with a request the forward
        pass's deferred copy-on-write into its slot."""
        match = super().match_prefix(key, cow_mamba=cow_mamba, req=req, **scheduler_args)
        if req is not None:
            self.copy_deferred_cow(req)
        return match

    def copy_deferred_cow(self, req: Any) -> None:
        """The forward pass's deferred copy-on-write: the state a match recorded
        (`mamba_cow_src_index`) is copied into the request's own slot."""
        slots = self.slots_of(req)
        if slots.mamba_cow_src_index is not None:
            self.mamba_pool.copy_from(slots.mamba_cow_src_index, slots.mamba_pool_idx.unsqueeze(0))
            slots.mamba_cow_src_index = None

    @functools.cached_property
    def _finishing_takes_kv_len(self) -> bool:
        """Whether the release's `cache_finished_req` takes `kv_len_to_handle` (0.5.16 on)."""
        return "kv_len_to_handle" in inspect.signature(self.cache.cache_finished_req).parameters

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """`release_kv_cache(req, tree_cache, is_insert)`: from 0.5.16 with the request's
        committed KV length (`kv_len_to_handle`); then the request slot goes back."""
        if not self._finishing_takes_kv_len:
            super().cache_finished_req(req, is_insert=is_insert)
            return
        committed = self.slots_of(req).kv_committed_len
        self.cache.cache_finished_req(req, is_insert=is_insert, kv_len_to_handle=committed)
        self.req_pool.free(req)
