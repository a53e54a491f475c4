"""`SlotLedger`: the checking-mode record of which pool slots are handed out.

Used by every pool in debug mode to refuse double frees, frees of slots never allocated, and any
hand-out of a reserved slot. The record is kept on the host and each check reads the indices
back once per call (a host sync), which is why debug mode is off by default on `cuda`.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, List, Sequence, Set, Union

import torch

from impl.errors import SlotError


Slots = Union[torch.Tensor, Sequence[int]]


def _as_list(indices: Slots) -> List[int]:
    if isinstance(indices, torch.Tensor):
        return (indices if indices.dim() == 1 else indices.reshape(-1)).tolist()
    return list(indices)


class SlotLedger:
    """The set of slots of `0..capacity-1` handed out; `reserved` slots may never be handed out.

    A call that breaks no rule costs a few set operations; only a refused one looks further, to
    name the rule and the slots."""

    def __init__(self, pool_name: str, capacity: int, reserved: Iterable[int]):
        self.pool_name = pool_name
        self.capacity = capacity
        self.reserved = frozenset(reserved)
        self._out: Set[int] = set()

    def on_alloc(self, indices: Slots) -> None:
        """Record `indices` as handed out; raise `SlotError` if any is outside the pool, reserved,
        repeated in the call or already out."""
        slots = _as_list(indices)
        handed = set(slots)
        inside = not slots or (min(slots) >= 0 and max(slots) < self.capacity)
        distinct = len(handed) == len(slots)
        if inside and distinct and self.reserved.isdisjoint(handed) and self._out.isdisjoint(handed):
            self._out |= handed
            return
        outside = [i for i in slots if not 0 <= i < self.capacity]
        if outside:
            raise SlotError(f"{self.pool_name}: slot(s) {outside} outside 0..{self.capacity - 1} handed out")
        bad_reserved = [i for i in slots if i in self.reserved]
        if bad_reserved:
            raise SlotError(f"{self.pool_name}: reserved slot(s) {bad_reserved} handed out")
        repeated = sorted(i for i, n in Counter(slots).items() if n > 1)
        if repeated:
            raise SlotError(f"{self.pool_name}: slot(s) {repeated} handed out twice in one call")
        already = [i for i in slots if i in self._out]
        raise SlotError(f"{self.pool_name}: slot(s) {already} handed out twice")

    def on_free(self, indices: Slots) -> None:
        """Record `indices` as returned; raise `SlotError` on a slot not out, or freed twice."""
        slots = _as_list(indices)
        returned = set(slots)
        if len(returned) == len(slots) and returned <= self._out:
            self._out -= returned
            return
        outside = [i for i in slots if not 0 <= i < self.capacity]
        if outside:
            raise SlotError(f"{self.pool_name}: slot(s) {outside} outside 0..{self.capacity - 1} freed")
        repeated = sorted(i for i, n in Counter(slots).items() if n > 1)
        if repeated:
            raise SlotError(f"{self.pool_name}: slot(s) {repeated} freed twice in one call")
        not_out = [i for i in slots if i not in self._out]
        raise SlotError(f"{self.pool_name}: slot(s) {not_out} freed but not allocated")

    def on_reset(self) -> None:
        self._out = set()


def debug_default(device: torch.device) -> bool:
    """Checking mode is on by default except on `cuda`, where it would sync on every call."""
    return device.type != "cuda"


def is_index_tensor(tensor: object) -> bool:
    """Whether `tensor` is a tensor of integers (slot indices), not floats, complex or bools."""
    return (
        isinstance(tensor, torch.Tensor)
        and not tensor.is_floating_point()
        and not tensor.is_complex()
        and tensor.dtype is not torch.bool
    )


def as_device(device) -> torch.device:
    """Normalise a device argument to the device its tensors report, naming it in the error
    when it is not one: `cuda` becomes `cuda:N`, the current one, so that a pool's device
    compares equal to its tensors' (`torch.device("cuda") != torch.device("cuda:0")`)."""
    try:
        resolved = torch.device(device)
    except (TypeError, RuntimeError):
        raise ValueError(f"not a torch device: {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available here")
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved
