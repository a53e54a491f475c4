"""`TokenToKVPoolAllocator`: hands out KV slots, one per token, as int64 index tensors.

Slots are `1..size`; slot 0 is the padding slot that dummy tokens write to and is never handed
out. Each slot carries a small payload row (the stand-in for the KV data) that callers may write
and read, so a test can tell whose data a slot holds.
"""

from __future__ import annotations

from typing import Optional

import torch

from impl.slot_ledger import SlotLedger, as_device, debug_default

RESERVED_KV_SLOT = 0


class TokenToKVPoolAllocator:
    """Free-list allocator of KV slots, SGLang's constructor shape (`size, dtype, device, ...`).

    Contract: `alloc(n)` returns n distinct free slots or None (nothing changes) when fewer than n
    are free; `free(indices)` returns slots; in debug mode a slot freed while not allocated, freed
    twice, or slot 0 ever handed out raises `SlotError` naming the slots, before any change.
    `need_sort` keeps frees aside and merges them sorted when the free list runs short, as SGLang.
    """

    def __init__(
        self,
        size: int,
        dtype: torch.dtype = torch.int64,
        device="cpu",
        kvcache=None,
        need_sort: bool = False,
        *,
        payload_width: int = 1,
        debug: Optional[bool] = None,
    ):
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype (pass device= by keyword), got {dtype!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"KV pool size must be a positive int, got {size!r}")
        if payload_width < 1:
            raise ValueError(f"payload_width must be positive, got {payload_width!r}")
        self.size = size
        self.page_size = 1
        self.dtype = dtype
        self.device = as_device(device)
        self._kvcache = kvcache
        self.need_sort = need_sort
        self.debug = debug_default(self.device) if debug is None else debug
        self.payload = torch.zeros((size + 1, payload_width), dtype=dtype, device=self.device)
        self._ledger = (
            SlotLedger("KV pool", size + 1, [RESERVED_KV_SLOT]) if self.debug else None
        )
        self.clear()

    def clear(self) -> None:
        """Every slot `1..size` free again."""
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.is_not_in_free_group = True
        self.free_group: list[torch.Tensor] = []
        if self._ledger is not None:
            self._ledger.on_reset()

    def available_size(self) -> int:
        return len(self.free_pages) + len(self.release_pages)

    def get_kvcache(self):
        return self._kvcache

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            self.free_pages = torch.cat((self.free_pages, self.release_pages))
            self.free_pages, _ = torch.sort(self.free_pages)
            self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """n free slots (int64, on the pool's device), or None when fewer are free."""
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise ValueError(f"alloc size must be a non-negative int, got {need_size!r}")
        if self.need_sort and need_size > len(self.free_pages):
            self.merge_and_sort_free()
        if need_size > len(self.free_pages):
            return None
        select = self.free_pages[:need_size]
        if self._ledger is not None:
            self._ledger.on_alloc(select)
        self.free_pages = self.free_pages[need_size:]
        return select

    def free(self, free_index: torch.Tensor) -> None:
        """Return slots to the pool (deferred while a free group is open)."""
        if free_index.numel() == 0:
            return
        if not self.is_not_in_free_group:
            self.free_group.append(free_index)
            return
        free_index = free_index.to(dtype=torch.int64).reshape(-1)
        if self._ledger is not None:
            self._ledger.on_free(free_index)
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_pages = torch.cat((self.free_pages, free_index))

    def free_group_begin(self) -> None:
        """Defer frees until `free_group_end`, which returns them in one batch."""
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self) -> None:
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(torch.cat(self.free_group))
        self.free_group = []

    def free_slots(self) -> torch.Tensor:
        """Every slot free right now, in hand-out order (for checks)."""
        return torch.cat((self.free_pages, self.release_pages))

    def write_payload(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Store `values` (one row, or one scalar, per slot) as the data of `indices`."""
        values = values.to(device=self.device, dtype=self.dtype)
        self.payload.index_copy_(0, indices.to(torch.int64), values.reshape(indices.numel(), -1))

    def read_payload(self, indices: torch.Tensor) -> torch.Tensor:
        """The data rows of `indices`, shape (len(indices), payload_width)."""
        return self.payload[indices.to(torch.int64)]
