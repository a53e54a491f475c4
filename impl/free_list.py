"""`FreeList`: a FIFO queue of free pool slots (int64, on the pool's device).

A pool that keeps its free slots in one tensor and appends every free with `torch.cat` pays for
the whole free list on each free: O(pool) per call, however few slots come back. Here frees are
queued as they come (O(1) each) and joined onto the head with one `torch.cat` only when a take
needs more than the head holds, so each slot is copied O(1) times between a free and its next
hand-out. The hand-out order is exactly that of cat-on-free: the head first, then the freed
slots in the order they were freed.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch


class FreeList:
    """Free slots in hand-out order. Contract: `take(n)` removes and returns the first n slots,
    or returns None and changes nothing when fewer than n are free; `put(slots)` queues slots at
    the back; `slots()` is every free slot in hand-out order. It does not check what it is given:
    the pools' ledgers do, through `take`'s `vet`."""

    def __init__(self, slots: torch.Tensor):
        self._head = slots
        self._start = 0  # self._head[:self._start] are handed out already
        self._head_len = slots.shape[0]  # free slots in the head, as an int (len() of a tensor is slow)
        self._tail: List[torch.Tensor] = []
        self._tail_len = 0

    def __len__(self) -> int:
        return self._head_len + self._tail_len

    def take(self, n: int, vet: Optional[Callable[[torch.Tensor], None]] = None) -> Optional[torch.Tensor]:
        """The first `n` free slots, removed from the list; None when fewer are free.

        `vet(slots)` runs before they are removed: if it raises, the list is as it was.
        """
        if n > self._head_len + self._tail_len:
            return None
        if n > self._head_len:
            self._join()
        select = self._head[self._start : self._start + n]
        if vet is not None:
            vet(select)
        self._start += n
        self._head_len -= n
        return select

    def put(self, slots: torch.Tensor, owned: bool = False) -> None:
        """Queue `slots` (1-D int64, on the list's device) behind every free slot. The list keeps
        a copy, so the caller may reuse its tensor afterwards; with `owned=True` the caller hands
        over a tensor nothing else refers to (a fresh conversion), kept as it is."""
        count = slots.numel()
        if count:
            self._tail.append(slots if owned else slots.clone())
            self._tail_len += count

    def slots(self) -> torch.Tensor:
        """Every free slot in hand-out order (the list itself is unchanged)."""
        self._join()
        return self._head[self._start :]

    def _join(self) -> None:
        if self._tail:
            # an exhausted head is left out: an empty piece puts torch.cat on a slow path, and a
            # pool that runs full frees and takes one slot at a time then adopts its lone tail
            pieces = self._tail if self._head_len == 0 else [self._head[self._start :], *self._tail]
            self._head = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            self._start = 0
            self._head_len += self._tail_len
            self._tail = []
            self._tail_len = 0
