"""`TokenToKVPoolAllocator`: hands out KV slots, one per token, as int64 index tensors.

Slots are `1..size`; slot 0 is the padding slot that dummy tokens write to and is never handed
out. Each slot carries a small payload row (the stand-in for the KV data) that callers may write
and read, so a test can tell whose data a slot holds.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from impl.errors import CacheMisuseError
from impl.free_list import FreeList
from impl.slot_ledger import SlotLedger, as_device, debug_default, is_index_tensor

RESERVED_KV_SLOT = 0


class TokenToKVPoolAllocator:
    """Free-list allocator of KV slots, SGLang's constructor shape (`size, dtype, device, ...`).

    Contract: `alloc(n)` returns n distinct free slots or None (nothing changes) when fewer than n
    are free; `free(indices)` returns slots; in debug mode a slot freed while not allocated, freed
    twice, or slot 0 ever handed out raises `SlotError` naming the slots, before any change.
    `need_sort` keeps frees aside and merges them sorted when the free list runs short, as SGLang.
    Frees cost what they return, not the size of the free list (see `FreeList`).
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
        self._free = FreeList(torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device))
        self._released = self._empty()
        self.is_not_in_free_group = True
        self.free_group: list[torch.Tensor] = []
        if self._ledger is not None:
            self._ledger.on_reset()

    def _empty(self) -> FreeList:
        return FreeList(torch.empty((0,), dtype=torch.int64, device=self.device))

    @property
    def free_pages(self) -> torch.Tensor:
        """The slots ready to hand out, in hand-out order (SGLang's attribute; assignable)."""
        return self._free.slots()

    @free_pages.setter
    def free_pages(self, slots: torch.Tensor) -> None:
        self._free = FreeList(slots.to(device=self.device, dtype=torch.int64).reshape(-1))

    @property
    def release_pages(self) -> torch.Tensor:
        """With `need_sort`, the freed slots not yet merged into `free_pages`."""
        return self._released.slots()

    def available_size(self) -> int:
        return len(self._free) + len(self._released)

    def get_kvcache(self):
        return self._kvcache

    def merge_and_sort_free(self) -> None:
        """Move the released slots into the free list, all of it sorted (SGLang's `need_sort`)."""
        if len(self._released) > 0:
            merged = torch.cat((self._free.slots(), self._released.slots()))
            self._free = FreeList(torch.sort(merged).values)
            self._released = self._empty()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """n free slots (int64, on the pool's device), or None when fewer are free."""
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise ValueError(f"alloc size must be a non-negative int, got {need_size!r}")
        if self.need_sort and need_size > len(self._free):
            self.merge_and_sort_free()
        return self._free.take(need_size, None if self._ledger is None else self._ledger.on_alloc)

    def free(self, free_index: Union[torch.Tensor, Sequence[int]]) -> None:
        """Return slots to the pool (deferred while a free group is open): an integer tensor or a
        sequence of ints; anything else is `CacheMisuseError`."""
        if not isinstance(free_index, torch.Tensor):
            try:
                free_index = torch.as_tensor(free_index, dtype=torch.int64, device=self.device)
            except (TypeError, ValueError, RuntimeError):
                raise CacheMisuseError(f"free: expected slot indices, got {free_index!r}") from None
        elif not is_index_tensor(free_index):
            raise CacheMisuseError(f"free: slot indices must be integers, got a {free_index.dtype} tensor")
        if free_index.numel() == 0:
            return
        if not self.is_not_in_free_group:
            # the group keeps its own copy: the caller may reuse its tensor (often a view of a
            # request row) before free_group_end (SGLang 0.5.4 kept the tensor; 0.5.20 copies)
            self.free_group.append(free_index.clone())
            return
        given = free_index
        if free_index.dtype is not torch.int64:
            free_index = free_index.to(dtype=torch.int64)
        if free_index.dim() != 1:
            free_index = free_index.reshape(-1)
        if self._ledger is not None:
            self._ledger.on_free(free_index)
        owned = free_index.data_ptr() != given.data_ptr()  # the cast made a copy of its own
        (self._released if self.need_sort else self._free).put(free_index, owned=owned)

    def free_group_begin(self) -> None:
        """Defer frees until `free_group_end`, which returns them in one batch."""
        self.is_not_in_free_group = False
        self.free_group = []

    def free_group_end(self) -> None:
        self.is_not_in_free_group = True
        if self.free_group:
            self.free(torch.cat(self.free_group))
        self.free_group = []

    @property
    def free_slots(self) -> torch.Tensor:
        """Every slot free right now, in hand-out order (for checks; read-only, spelt as
        `MambaPool.free_slots`)."""
        return torch.cat((self._free.slots(), self._released.slots()))

    def write_payload(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Store `values` (one row, or one scalar, per slot) as the data of `indices`."""
        values = values.to(device=self.device, dtype=self.dtype)
        self.payload.index_copy_(0, indices.to(torch.int64), values.reshape(indices.numel(), -1))

    def read_payload(self, indices: torch.Tensor) -> torch.Tensor:
        """The data rows of `indices`, shape (len(indices), payload_width)."""
        return self.payload[indices.to(torch.int64)]
