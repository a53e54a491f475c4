"""`Sglang0520Cache`: SGLang 0.5.20's own `MambaRadixCache` and pools as a cache under test.

The req-kv era (0.5.19 .. 0.5.20): what changed from the mamba-allocator era (`Sglang0513Cache`,
and before it 0.5.9's parameter objects, 0.5.6's `CacheInitParams`) is that a request keeps its
slots and KV lengths in `req.kv` (`ReqKvInfo`).

Each method below makes the call in 0.5.20's form that stands for the 0.5.4-era call of the
same name, the way 0.5.20's own scheduler helpers make it: finishing is `release_kv_cache`
(`mem_cache/common.py`: `cache_finished_req(req, is_insert, kv_len_to_handle=<committed>)`,
then `req_to_token_pool.free(req)`); a copy-on-write match is followed by the forward pass's
deferred copy. No protocol of 0.5.20's own scheduler is transcribed yet (see
`docs/scheduler-protocol.md`): this cache runs under the contract protocol.

Behaviour the model follows for it (`reference.SGLANG_0_5_20` at 0.5.20, each release's own
switches before: `harness.caches.sglang_releases.mamba_radix_cache_rules`): the Mamba LRU is
refreshed only for the state a match uses and for states new to the tree; an insert that ends on
an existing node refreshes it; insert frees the caller's duplicate KV itself; freed Mamba slots
keep stale data; Mamba and request slots start at 1, and request slots are taken from the tail.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, Hashable, List, Optional, Sequence

import torch

from harness.caches.sglang_0_5_13 import Sglang0513Cache



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


class Sglang0520Cache(Sglang0513Cache):
    """SGLang 0.5.20's `MambaRadixCache` with SGLang's pools (see the module docstring)."""

    def _install_clock(self, sgl: Any) -> None:
        """0.5.20's tree stamps nodes for its self-check only with a counter of its own."""
        return None

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Req0520:
        return Req0520(self.sgl.ReqKvInfo(), rid, tokens, extra_key, self.device)

    def slots_of(self, req: Any) -> Any:
        return req.kv

    def allocated_len_of(self, req: Any) -> int:
        """How many positions of the request's row hold KV slots it was given."""
        return self.slots_of(req).kv_allocated_len

    def protected_len_of(self, req: Any) -> int:
        """How many positions of the request's row the tree holds (`cache_protected_len`)."""
        return self.slots_of(req).cache_protected_len

    def track_slots_of(self, req: Any) -> List[int]:
        """The request's track slots, position by position (the extra buffer's ping-pong
        buffer; none without it, or once freed)."""
        buffer = getattr(self.slots_of(req), "mamba_ping_pong_track_buffer", None)
        return [] if buffer is None else [int(slot) for slot in buffer.tolist() if slot >= 0]

    def kv_released(self, req: Any) -> bool:
        """Whether the request's KV went back (`release_kv_cache` done)."""
        return req.kv.is_kv_released
    def sanity_check(self) -> None:
        """The tree's self-check, in the single-GPU process it runs in (tensor-parallel rank 0:
        a failed check prints the tree and raises, as it does there; the print is dropped)."""
        with self.sgl.runtime_context.get_parallel().override(tp_rank=0), contextlib.redirect_stdout(io.StringIO()):
            self.cache.sanity_check()
