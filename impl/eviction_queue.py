"""`EvictionQueue`: the least recently used eviction candidate without rescanning the LRU list.

The seed walks its LRU list from the tail past locked and internal nodes on every eviction, which
is quadratic when many such nodes sit at the tail. This queue is a min-heap of (tick, node) offers
with lazy deletion: the owner offers a node whenever it may have become a candidate or its tick
changed; stale offers are dropped when they surface. The result is exactly the LRU order of the
candidates, at O(log n) amortised per offer and pop.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Optional


class EvictionQueue:
    """Candidates of one LRU list, least recently used first.

    `is_candidate(node, tick)` decides whether an offer is still current: the node is in the tree,
    satisfies the queue's rule (e.g. unlocked leaf) and still carries that tick.
    """

    def __init__(self, is_candidate: Callable[[Any, int], bool]):
        self._is_candidate = is_candidate
        self._heap: list[tuple[int, int, Any]] = []

    def offer(self, node: Any, tick: int) -> None:
        """Record that `node`, stamped `tick`, may be a candidate."""
        heapq.heappush(self._heap, (tick, node.id, node))

    def pop_lru(self) -> Optional[Any]:
        """Remove and return the least recently used current candidate, or None."""
        heap = self._heap
        while heap:
            tick, _, node = heapq.heappop(heap)
            if self._is_candidate(node, tick):
                return node
        return None

    def compact(self, live_nodes: int) -> None:
        """Drop stale offers: those at the front now (so the next `pop_lru` does not pay for a
        backlog of them in one call), and all of them once the heap outgrows the live nodes
        (keeping memory O(tree)). Each offer is dropped once: amortised O(log n) per offer."""
        heap = self._heap
        while heap and not self._is_candidate(heap[0][2], heap[0][0]):
            heapq.heappop(heap)
        if len(heap) <= 2 * live_nodes + 64:
            return
        current = {}
        for tick, node_id, node in self._heap:
            if self._is_candidate(node, tick):
                current[node_id] = (tick, node_id, node)
        self._heap = list(current.values())
        heapq.heapify(self._heap)
