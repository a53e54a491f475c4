"""`Sglang0520Cache`: SGLang 0.5.20's own `MambaRadixCache` and pools as a cache under test.

0.5.20's API differs from 0.5.4's: the cache is built from `CacheInitParams` and reads
process-wide server args (published here through SGLang's own test override, as SGLang's tests
do); `match_prefix`, `insert` and `evict` take parameter objects; a request keeps its slots in
`req.kv` (`ReqKvInfo`); Mamba slots come from `req_to_token_pool.mamba_allocator`; the request
pool's `alloc` and `free` take requests; copy-on-write is deferred to the forward pass (the match
records `mamba_cow_src_index`); `cache_finished_req` needs `kv_len_to_handle` and no longer
frees the request slot.

Each method below makes the call in 0.5.20's form that stands for the 0.5.4-era call of the
same name, the way 0.5.20's own scheduler helpers make it: finishing is `release_kv_cache`
(`mem_cache/common.py`: `cache_finished_req(req, is_insert, kv_len_to_handle=<committed>)`,
then `req_to_token_pool.free(req)`); a copy-on-write match is followed by the forward pass's
deferred copy. No protocol of 0.5.20's own scheduler is transcribed yet (see
`docs/scheduler-protocol.md`): this cache runs under the contract protocol.

Behaviour the model follows for it (`reference.SGLANG_0_5_20`): the Mamba LRU is refreshed only
for the state a match uses and for states new to the tree; an insert that ends on an existing
node refreshes it; insert frees the caller's duplicate KV itself; freed Mamba slots keep stale
data; Mamba and request slots start at 1, and request slots are taken from the tail.
"""

from __future__ import annotations

import contextlib
import functools
import io
import types
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness.caches.sglang_0_5_4 import Sglang054Cache
from reference import SGLANG_0_5_20
from strategies.config import CacheConfig

MAMBA_CACHE_CHUNK_SIZE = 64  # the Mamba cache chunk size SGLang's own test kits pin


class Req0520:
    """A request as SGLang 0.5.20's cache reads it, its slots in SGLang's own `ReqKvInfo`
    (`req.kv`); `req_pool_idx` and `mamba_pool_idx` read and write those fields."""

    def __init__(self, kv_info: Any, rid: int, tokens: Sequence[int], extra_key: Hashable, device: torch.device):
        self.rid = rid
        self.origin_input_ids = list(tokens)
        self.output_ids: List[int] = []
        self.fill_ids: List[int] = []
        self.extra_key = extra_key
        self.cache_salt = None
        self.kv = kv_info
        self.prefix_indices = torch.empty((0,), dtype=torch.int64, device=device)
        self.last_node: Any = None

    def get_fill_ids(self) -> List[int]:
        return self.fill_ids

    @property
    def req_pool_idx(self) -> Optional[int]:
        return self.kv.req_pool_idx

    @req_pool_idx.setter
    def req_pool_idx(self, value: Optional[int]) -> None:
        self.kv.req_pool_idx = value

    @property
    def mamba_pool_idx(self) -> Optional[torch.Tensor]:
        return self.kv.mamba_pool_idx

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: Optional[torch.Tensor]) -> None:
        self.kv.mamba_pool_idx = value


class Sglang0520Cache(Sglang054Cache):
    """SGLang 0.5.20's `MambaRadixCache` with SGLang's pools (see the module docstring)."""

    default_protocol = "contract"
    rules = SGLANG_0_5_20

    def _install_clock(self, sgl: Any) -> None:
        """0.5.20's tree stamps nodes for its self-check only with a counter of its own."""
        return None

    def _req_pool_args(self, config: CacheConfig) -> Dict[str, Any]:
        return dict(
            super()._req_pool_args(config),
            mamba_spec_state_size=config.mamba_size,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False,
            enable_overlap_schedule=False,
        )

    def _mamba_slots(self) -> Any:
        return self.req_pool.mamba_allocator

    def _build_cache(self, config: CacheConfig) -> Any:
        _publish_server_args(self.sgl.runtime_context, MAMBA_CACHE_CHUNK_SIZE)
        return self.sgl.MambaRadixCache(
            self.sgl.CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.kv,
                page_size=config.page_size,
            )
        )

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Req0520:
        return Req0520(self.sgl.ReqKvInfo(), rid, tokens, extra_key, self.device)

    def mamba_tensors(self) -> List[torch.Tensor]:
        cache = self.mamba_pool.mamba_cache
        return [cache.temporal, *cache.conv]

    def adopt_match(self, req: Any, match: Any) -> None:
        super().adopt_match(req, match)
        req.kv.cache_protected_len = len(match.device_indices)

    def reset_for_retract(self, req: Any) -> None:
        super().reset_for_retract(req)
        req.kv.cache_protected_len = 0

    def match_prefix(self, key: Any, cow_mamba: bool = False, req: Any = None, **scheduler_args: Any) -> Any:
        """`match_prefix(MatchPrefixParams(key, cow_mamba, req))`; the policy's own arguments
        (`rid`) have no place in 0.5.20's parameters. A copy-on-write match is followed by
        the forward pass's deferred copy into the request's slot."""
        match = self.cache.match_prefix(self.sgl.MatchPrefixParams(key=key, cow_mamba=cow_mamba, req=req))
        if req is not None:
            self.copy_deferred_cow(req)
        return match

    def copy_deferred_cow(self, req: Any) -> None:
        """The forward pass's deferred copy-on-write: the state a match recorded
        (`req.kv.mamba_cow_src_index`) is copied into the request's own slot."""
        if req.kv.mamba_cow_src_index is not None:
            self.mamba_pool.copy_from(req.kv.mamba_cow_src_index, req.kv.mamba_pool_idx.unsqueeze(0))
            req.kv.mamba_cow_src_index = None

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        result = self.cache.insert(self.sgl.InsertParams(key=key, value=kv, mamba_value=mamba))
        return result.prefix_len, result.mamba_exist

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """`release_kv_cache(req, tree_cache, is_insert)`: every token computed (all but the
        last output) is handled, then the request slot goes back."""
        committed = len(req.origin_input_ids) + len(req.output_ids) - 1
        self.cache.cache_finished_req(req, is_insert=is_insert, kv_len_to_handle=committed)
        self.req_pool.free(req)

    def sanity_check(self) -> None:
        """The tree's self-check, in the single-GPU process it runs in (tensor-parallel rank 0:
        a failed check prints the tree and raises, as it does there; the print is dropped)."""
        with self.sgl.runtime_context.get_parallel().override(tp_rank=0), contextlib.redirect_stdout(io.StringIO()):
            self.cache.sanity_check()

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens))

    def req_alloc(self, reqs: Sequence[Any]) -> Optional[List[int]]:
        return self.req_pool.alloc(list(reqs))

    def req_free(self, req: Any, free_mamba_cache: bool = True) -> None:
        """The request slot goes back (`req_to_token_pool.free(req)`), its Mamba slot too unless
        told otherwise (`free_mamba_cache(req)` first)."""
        if free_mamba_cache:
            self.req_pool.free_mamba_cache(req)
        self.req_pool.free(req)


@functools.lru_cache(maxsize=None)
def _publish_server_args(runtime_context: types.ModuleType, chunk_size: int) -> Any:
    """Publish (once per process) the server args 0.5.20's cache reads: only the Mamba cache
    chunk size, pinned as SGLang's own test kits pin it, since deriving it needs a model."""
    return runtime_context.get_context().override_server_args(_mamba_cache_chunk_size=chunk_size).install()
