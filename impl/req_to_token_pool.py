"""`HybridReqToTokenPool`: request slots, their token-to-KV rows, and each one's Mamba slot.

`req_to_token[r, i]` is the KV slot of token i of the request in slot r. Each request slot maps to
the Mamba slot holding that request's running state (`get_mamba_indices`); with the extra buffer
(`mamba_tracking_slots`) a request also holds track slots its checkpoints are written into.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import torch

from impl.mamba_pool import MambaPool
from impl.slot_ledger import SlotLedger, as_device, debug_default


class HybridReqToTokenPool:
    """Request-slot pool with a `MambaPool` inside (`self.mamba_pool`).

    Contract: `alloc(n, reqs)` gives n request slots (a list of ints) and gives every request
    without one (`req.mamba_pool_idx is None`) a Mamba slot, or returns None and changes nothing
    when either pool is short. `free(idx, free_mamba_cache=True)` returns request slots and, unless
    told otherwise, their Mamba slots. Debug mode refuses freeing a request slot not in use.
    """

    def __init__(
        self,
        size: int,
        mamba_size: int,
        max_context_len: int,
        device="cpu",
        enable_memory_saver: bool = False,
        *,
        conv_shape: Sequence[int] = (2,),
        temporal_shape: Sequence[int] = (2,),
        num_mamba_layers: int = 1,
        mamba_dtype: torch.dtype = torch.float32,
        debug: Optional[bool] = None,
        mamba_tracking_slots: int = 0,
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"request pool size must be a positive int, got {size!r}")
        if isinstance(max_context_len, bool) or not isinstance(max_context_len, int) or max_context_len < 1:
            raise ValueError(f"max_context_len must be a positive int, got {max_context_len!r}")
        if mamba_tracking_slots not in (0, 1, 2):
            raise ValueError(f"mamba_tracking_slots must be 0, 1 or 2, got {mamba_tracking_slots!r}")
        self.size = size
        self.max_context_len = max_context_len
        # the extra buffer: track slots per request beside its running state (a ping-pong pair
        # under the overlap loop), `req.mamba_ping_pong_track_buffer`
        self.mamba_ping_pong_track_buffer_size = mamba_tracking_slots
        self.device = as_device(device)
        self.enable_memory_saver = enable_memory_saver
        self.debug = debug_default(self.device) if debug is None else debug
        self.req_to_token = torch.zeros(
            (size, max_context_len), dtype=torch.int32, device=self.device
        )
        self.mamba_pool = MambaPool(
            mamba_size,
            self.device,
            conv_shape,
            temporal_shape,
            num_layers=num_mamba_layers,
            dtype=mamba_dtype,
            debug=self.debug,
        )
        self.req_index_to_mamba_index_mapping = torch.zeros(
            size, dtype=torch.int32, device=self.device
        )
        self._ledger = SlotLedger("request pool", size, []) if self.debug else None
        self.free_slots: List[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def write(self, indices, values) -> None:
        """`req_to_token[indices] = values` (indices as in tensor indexing, e.g. (row, slice))."""
        self.req_to_token[indices] = values

    def alloc(self, need_size: int, reqs: Optional[List[Any]] = None) -> Optional[List[int]]:
        """`need_size` request slots for `reqs` (one each), or None with nothing changed."""
        reqs = [] if reqs is None else list(reqs)
        if len(reqs) != need_size:
            raise ValueError(f"alloc({need_size}) needs exactly {need_size} reqs, got {len(reqs)}")
        if need_size > len(self.free_slots):
            return None
        without_mamba = [req for req in reqs if req.mamba_pool_idx is None]
        tracks = self.mamba_ping_pong_track_buffer_size
        untracked = [req for req in reqs if tracks and getattr(req, "mamba_ping_pong_track_buffer", None) is None]
        fresh = self.mamba_pool.alloc(len(without_mamba) + tracks * len(untracked))
        if fresh is None:
            return None
        for req, mamba_idx in zip(without_mamba, fresh):
            req.mamba_pool_idx = mamba_idx
        for i, req in enumerate(untracked):
            start = len(without_mamba) + i * tracks
            req.mamba_ping_pong_track_buffer = fresh[start : start + tracks].clone()
            req.mamba_last_track_idx = 0
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        if self._ledger is not None:
            self._ledger.on_alloc(select)
        if need_size == 1:
            self.req_index_to_mamba_index_mapping[select[0]] = reqs[0].mamba_pool_idx
        elif need_size:
            mamba_indices = torch.stack(
                [torch.as_tensor(req.mamba_pool_idx, device=self.device).reshape(()) for req in reqs]
            )
            self.req_index_to_mamba_index_mapping[select] = mamba_indices.to(torch.int32)
        return select

    def get_mamba_indices(self, req_indices) -> torch.Tensor:
        """The Mamba slot(s) of request slot(s) `req_indices` (int32)."""
        return self.req_index_to_mamba_index_mapping[req_indices]

    def free(self, free_index: Union[int, List[int]], free_mamba_cache: bool = True) -> None:
        """Return request slot(s); with `free_mamba_cache`, their Mamba slots too."""
        indices = [free_index] if isinstance(free_index, int) else list(free_index)
        if self._ledger is not None:
            self._ledger.on_free(indices)
        self.free_slots.extend(indices)
        if free_mamba_cache and indices:
            self.mamba_pool.free(self.req_index_to_mamba_index_mapping[indices])

    # ----- the extra buffer's track slots (SGLang's `HybridReqToTokenPool` calls) ---------------

    def get_mamba_ping_pong_keep_idx(self, req: Any) -> int:
        """The position in the request's track buffer of its latest checkpoint."""
        return req.mamba_last_track_idx

    def get_mamba_ping_pong_other_idx(self, idx: int) -> int:
        """The other position of a ping-pong pair (the same one when there is one slot)."""
        return 1 - idx if self.mamba_ping_pong_track_buffer_size == 2 else idx

    def donate_mamba_ping_pong_slot(self, req: Any, new_slot: torch.Tensor) -> torch.Tensor:
        """The request's latest track slot (shape [1]), for the tree; `new_slot` takes its place."""
        idx = self.get_mamba_ping_pong_keep_idx(req)
        donated = req.mamba_ping_pong_track_buffer[idx].reshape(1).clone()
        req.mamba_ping_pong_track_buffer[idx] = torch.as_tensor(new_slot, device=self.device).reshape(())
        return donated

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: Optional[int] = None) -> None:
        """Free the request's running Mamba slot, then its track slots in order but the one at
        `mamba_ping_pong_track_buffer_to_keep` (the tree took it)."""
        self.mamba_pool.free(torch.as_tensor(req.mamba_pool_idx, device=self.device).reshape(1))
        req.mamba_pool_idx = None
        buffer = getattr(req, "mamba_ping_pong_track_buffer", None)
        if buffer is not None:
            kept = [i for i in range(len(buffer)) if i != mamba_ping_pong_track_buffer_to_keep]
            if kept:
                self.mamba_pool.free(buffer[kept])
            req.mamba_ping_pong_track_buffer = None

    def clear(self) -> None:
        """Every request slot and Mamba slot free again."""
        self.free_slots = list(range(self.size))
        self.mamba_pool.clear()
        if self._ledger is not None:
            self._ledger.on_reset()
