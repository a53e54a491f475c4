"""`EvictionQueue`: the least recently used eviction candidate without rescanning the LRU list.

The seed walks its LRU list from the tail past locked and internal nodes on every eviction, which
is quadratic when many such nodes sit at the tail. This queue is a min-heap of (tick, node)
entries, kept lazily: a node is offered when it becomes a candidate (inserted, unlocked, left a
leaf), not each time it is refreshed. An entry may therefore be older than its node's current
tick; it is re-keyed to the current tick when it reaches the front, and dropped there if its node
is no longer a candidate. Since ticks only grow, an entry's tick is never above its node's, so
the front, once it carries its node's current tick, is exactly the least recently used candidate.
Entries refer to their nodes weakly: an entry left behind by a node that has left the tree does
not keep the node alive.
"""

from __future__ import annotations

import heapq
import weakref
from typing import Any, Callable, Optional


class EvictionQueue:
    """Candidates of one LRU list, least recently used first.

    `current_tick(node)` is the node's tick if it is a candidate now (in the list and satisfying
    the queue's rule, e.g. unlocked leaf), else None. Contract: every candidate has been offered
    since it last became one; then `pop_lru` returns the candidate with the smallest tick.
    """

    def __init__(self, current_tick: Callable[[Any], Optional[int]]):
        self._current_tick = current_tick
        self._heap: list[tuple[int, int, weakref.ref]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def offer(self, node: Any, tick: int) -> None:
        """Record that `node`, stamped `tick`, may be a candidate."""
        heapq.heappush(self._heap, (tick, node.id, weakref.ref(node)))

    def pop_lru(self) -> Optional[Any]:
        """Remove and return the least recently used candidate, or None."""
        self.settle_front()
        return heapq.heappop(self._heap)[2]() if self._heap else None

    def settle_front(self) -> None:
        """Bring the front entry up to date: drop entries whose node is no longer a candidate and
        re-key those refreshed since their offer, until the front carries its node's current tick.
        Called after each refresh too, so that no backlog builds up for one `pop_lru` to pay.
        Each entry is dropped once and re-keyed at most once per refresh of its node."""
        heap = self._heap
        while heap:
            tick, node_id, ref = heap[0]
            node = ref()
            now = None if node is None else self._current_tick(node)
            if now == tick:
                return
            if now is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (now, node_id, ref))

    def compact(self, live_nodes: int) -> None:
        """Once the heap outgrows the live nodes (a node offered again while still queued leaves
        two entries), keep one entry per current candidate: memory stays O(tree)."""
        if len(self._heap) <= 2 * live_nodes + 64:
            return
        current = {}
        for _, node_id, ref in self._heap:
            node = ref()
            now = None if node is None else self._current_tick(node)
            if now is not None:
                current[node_id] = (now, node_id, ref)
        self._heap = list(current.values())
        heapq.heapify(self._heap)
