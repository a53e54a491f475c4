"""`SlotLedger`: the checking-mode record of which pool slots are handed out.

Used by every pool in debug mode to refuse double frees, frees of slots never allocated, and any
hand-out of a reserved slot. Each check reads the device once per call (a host sync), which is why
debug mode is off by default on `cuda`.
"""

from __future__ import annotations

from typing import Iterable

import torch

from impl.errors import SlotError


class SlotLedger:
    """Allocation flags for slots `0..capacity-1`; `reserved` slots may never be handed out."""

    def __init__(self, pool_name: str, capacity: int, reserved: Iterable[int], device: torch.device):
        self.pool_name = pool_name
        self.reserved = frozenset(reserved)
        self._allocated = torch.zeros(capacity, dtype=torch.bool, device=device)

    def on_alloc(self, indices: torch.Tensor) -> None:
        """Record `indices` as handed out; raise `SlotError` if any is reserved or already out."""
        indices = indices.to(device=self._allocated.device, dtype=torch.int64).reshape(-1)
        bad_reserved = [i for i in indices.tolist() if i in self.reserved]
        if bad_reserved:
            raise SlotError(f"{self.pool_name}: reserved slot(s) {bad_reserved} handed out")
        already = indices[self._allocated[indices]]
        if already.numel():
            raise SlotError(f"{self.pool_name}: slot(s) {already.tolist()} handed out twice")
        self._allocated[indices] = True

    def on_free(self, indices: torch.Tensor) -> None:
        """Record `indices` as returned; raise `SlotError` on a slot not out, or freed twice."""
        indices = indices.to(device=self._allocated.device, dtype=torch.int64).reshape(-1)
        capacity = self._allocated.numel()
        outside = indices[(indices < 0) | (indices >= capacity)]
        if outside.numel():
            raise SlotError(
                f"{self.pool_name}: slot(s) {outside.tolist()} outside 0..{capacity - 1} freed"
            )
        unique, counts = torch.unique(indices, return_counts=True)
        repeated = unique[counts > 1]
        if repeated.numel():
            raise SlotError(f"{self.pool_name}: slot(s) {repeated.tolist()} freed twice in one call")
        not_out = indices[~self._allocated[indices]]
        if not_out.numel():
            raise SlotError(
                f"{self.pool_name}: slot(s) {not_out.tolist()} freed but not allocated"
            )
        self._allocated[indices] = False

    def on_reset(self) -> None:
        self._allocated.zero_()


def debug_default(device: torch.device) -> bool:
    """Checking mode is on by default except on `cuda`, where it would sync on every call."""
    return device.type != "cuda"


def as_device(device) -> torch.device:
    """Normalise a device argument, naming it in the error when it is not one."""
    try:
        return torch.device(device)
    except (TypeError, RuntimeError):
        raise ValueError(f"not a torch device: {device!r}") from None
