"""`SlotLedger`: the checking-mode record of which pool slots are handed out.

Used by every pool in debug mode to refuse double frees, frees of slots never allocated, and any
hand-out of a reserved slot. The record is kept on the host and each check reads the indices
back once per call (a host sync), which is why debug mode is off by default on `cuda`.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, List, Sequence, Union

import torch

from impl.errors import SlotError


Slots = Union[torch.Tensor, Sequence[int]]


def _as_list(indices: Slots) -> List[int]:
    return indices.reshape(-1).tolist() if isinstance(indices, torch.Tensor) else list(indices)


class SlotLedger:
    """Allocation flags for slots `0..capacity-1`; `reserved` slots may never be handed out."""

    def __init__(self, pool_name: str, capacity: int, reserved: Iterable[int]):
        self.pool_name = pool_name
        self.reserved = frozenset(reserved)
        self._allocated = bytearray(capacity)

    def on_alloc(self, indices: Slots) -> None:
        """Record `indices` as handed out; raise `SlotError` if any is reserved or already out."""
        slots = _as_list(indices)
        bad_reserved = [i for i in slots if i in self.reserved]
        if bad_reserved:
            raise SlotError(f"{self.pool_name}: reserved slot(s) {bad_reserved} handed out")
        already = [i for i in slots if self._allocated[i]]
        if already:
            raise SlotError(f"{self.pool_name}: slot(s) {already} handed out twice")
        for i in slots:
            self._allocated[i] = 1

    def on_free(self, indices: Slots) -> None:
        """Record `indices` as returned; raise `SlotError` on a slot not out, or freed twice."""
        slots = _as_list(indices)
        capacity = len(self._allocated)
        outside = [i for i in slots if not 0 <= i < capacity]
        if outside:
            raise SlotError(f"{self.pool_name}: slot(s) {outside} outside 0..{capacity - 1} freed")
        repeated = sorted(i for i, n in Counter(slots).items() if n > 1)
        if repeated:
            raise SlotError(f"{self.pool_name}: slot(s) {repeated} freed twice in one call")
        not_out = [i for i in slots if not self._allocated[i]]
        if not_out:
            raise SlotError(f"{self.pool_name}: slot(s) {not_out} freed but not allocated")
        for i in slots:
            self._allocated[i] = 0

    def on_reset(self) -> None:
        self._allocated = bytearray(len(self._allocated))


def debug_default(device: torch.device) -> bool:
    """Checking mode is on by default except on `cuda`, where it would sync on every call."""
    return device.type != "cuda"


def as_device(device) -> torch.device:
    """Normalise a device argument, naming it in the error when it is not one."""
    try:
        return torch.device(device)
    except (TypeError, RuntimeError):
        raise ValueError(f"not a torch device: {device!r}") from None
