"""`MambaPool`: per-request Mamba states (conv and temporal tensors) in numbered slots.

Slots `0..size-1` are handed out; the state tensors have one extra row, slot `size`, kept as the
padding slot (never handed out), as in SGLang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from impl.free_list import FreeList
from impl.slot_ledger import SlotLedger, as_device, debug_default

Indices = Union[torch.Tensor, Sequence[int]]


@dataclass(frozen=True)
class MambaState:
    """State tensors, shaped (num_layers, size + 1, *shape) (views of the pool's one buffer)."""

    conv: torch.Tensor
    temporal: torch.Tensor


class MambaPool:
    """Free-list pool of Mamba state slots.

    Contract: `alloc(n)` returns n distinct slots or None (nothing changes); `free` zeroes the
    states of the freed slots; `copy_from(src, dst)` copies states; `fork_from(src)` allocates one
    slot and copies `src` into it (None when full). Debug mode refuses bad frees (`SlotError`).
    """

    def __init__(
        self,
        size: int,
        device="cpu",
        conv_shape: Sequence[int] = (2,),
        temporal_shape: Sequence[int] = (2,),
        *,
        num_layers: int = 1,
        dtype: torch.dtype = torch.float32,
        debug: Optional[bool] = None,
    ):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Mamba pool size must be a positive int, got {size!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be positive, got {num_layers!r}")
        self.size = size
        self.device = as_device(device)
        self.debug = debug_default(self.device) if debug is None else debug
        conv_shape, temporal_shape = tuple(conv_shape), tuple(temporal_shape)
        if any(d < 1 for d in conv_shape + temporal_shape):
            raise ValueError(f"Mamba state shapes must be positive, got conv {conv_shape} and temporal {temporal_shape}")
        conv_width = math.prod(conv_shape)
        # both states of a slot side by side in one row, so a copy, a free or a fill of slots is
        # one tensor operation; conv and temporal are views of it
        self._states = torch.zeros(
            (num_layers, size + 1, conv_width + math.prod(temporal_shape)), dtype=dtype, device=self.device
        )
        self.mamba_cache = MambaState(
            conv=self._states[:, :, :conv_width].unflatten(2, conv_shape),
            temporal=self._states[:, :, conv_width:].unflatten(2, temporal_shape),
        )
        self._ledger = SlotLedger("Mamba pool", size + 1, [size]) if self.debug else None
        self.clear()

    def clear(self) -> None:
        """Every slot free again (states are left as they are)."""
        self._free = FreeList(torch.arange(self.size, dtype=torch.int64, device=self.device))
        if self._ledger is not None:
            self._ledger.on_reset()

    @property
    def states(self) -> torch.Tensor:
        """Every slot's conv and temporal state side by side, shaped (num_layers, size + 1,
        conv elements + temporal elements); `mamba_cache.conv` / `.temporal` are views of it."""
        return self._states

    @property
    def free_slots(self) -> torch.Tensor:
        """The free slots in hand-out order (SGLang's attribute; assignable)."""
        return self._free.slots()

    @free_slots.setter
    def free_slots(self, slots: torch.Tensor) -> None:
        self._free = FreeList(slots.to(device=self.device, dtype=torch.int64).reshape(-1))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """n free slots (int64), or None when fewer are free."""
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise ValueError(f"alloc size must be a non-negative int, got {need_size!r}")
        return self._free.take(need_size, None if self._ledger is None else self._ledger.on_alloc)

    def free(self, free_index: Indices) -> None:
        """Return slots and zero their states."""
        index = self._as_index(free_index)
        if index.numel() == 0:
            return
        if self._ledger is not None:
            self._ledger.on_free(index)
        owned = not isinstance(free_index, torch.Tensor) or index.data_ptr() != free_index.data_ptr()
        self._free.put(index, owned=owned)  # owned: the conversion made a copy of its own
        self._states.index_fill_(1, index, 0)

    def copy_from(self, src_index: Indices, dst_index: Indices) -> None:
        """Copy the states of `src_index` into `dst_index`, slot by slot."""
        src, dst = self._as_index(src_index, source=True), self._as_index(dst_index)
        if src.numel() != dst.numel():
            raise ValueError(f"copy_from: {src.numel()} source slots but {dst.numel()} destinations")
        self._states.index_copy_(1, dst, self._states.index_select(1, src))

    def fork_from(self, src_index: Indices) -> Optional[torch.Tensor]:
        """A new slot holding a copy of `src_index`'s state, or None when the pool is full."""
        dst = self.alloc(1)
        if dst is None:
            return None
        self.copy_from(src_index, dst)
        return dst

    def fill(self, index: Indices, value: float) -> None:
        """Set every element of the states of `index` to `value` (a stand-in for a forward pass)."""
        self._states.index_fill_(1, self._as_index(index), value)

    def _as_index(self, index: Indices, source: bool = False) -> torch.Tensor:
        """`index` as a 1-D index tensor on the pool's device: int64, or for a `source` (only
        read through `index_select`, which takes both) int32 as well."""
        if isinstance(index, torch.Tensor):
            if (index.dtype is torch.int64 or (source and index.dtype is torch.int32)) and index.device == self.device:
                return index if index.dim() == 1 else index.reshape(-1)
            return index.to(device=self.device, dtype=torch.int64).reshape(-1)
        return torch.tensor(list(index), dtype=torch.int64, device=self.device)
