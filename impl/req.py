"""`Req`: the request fields the cache reads and writes, as SGLang's scheduler's `Req` has them."""

from __future__ import annotations

from typing import Any, Hashable, List, Optional

import torch


class Req:
    """A request as the cache sees it.

    `fill_ids` are the tokens computed so far (what `cache_unfinished_req` inserts),
    `prefix_indices` the KV slots the request shares with the tree, `last_node` the node it holds
    a lock on, `req_pool_idx` its request slot, `mamba_pool_idx` its running Mamba slot; with the
extra buffer, its track slots and the lengths of what they hold.
    """

    def __init__(self, rid: Any, origin_input_ids: List[int], extra_key: Optional[Hashable] = None):
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: List[int] = []
        self.fill_ids: List[int] = []
        self.extra_key = extra_key
        self.req_pool_idx: Optional[int] = None
        self.mamba_pool_idx: Optional[torch.Tensor] = None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.last_node: Any = None
        # with the extra buffer: the request's track slots (a ping-pong pair under the overlap
        # loop) and the lengths of the latest checkpoint and the one before, as the scheduler
        # records them
        self.mamba_ping_pong_track_buffer: Optional[torch.Tensor] = None
        self.mamba_last_track_idx = 0  # the position in it of the latest checkpoint
        self.mamba_last_track_seqlen: Optional[int] = None
        self.mamba_prev_track_seqlen: Optional[int] = None

    def __repr__(self) -> str:
        return (
            f"Req(rid={self.rid!r}, input={len(self.origin_input_ids)}, output={len(self.output_ids)}, "
            f"req_pool_idx={self.req_pool_idx}, prefix={len(self.prefix_indices)})"
        )
