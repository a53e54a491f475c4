"""`LRUList`: an intrusive doubly linked list of tree nodes, most recently used at the head.

One class serves both the full (KV) list and the Mamba list: each node carries one `Link` per
list, and a list is told which attribute holds its link and which members are evictable. Every
list update is O(1). Each placement at the head stamps the link with a fresh, strictly increasing
tick, so the list is always sorted by tick (head = largest). The list answers "least recently used
evictable member" through an `EvictionQueue` ordered by those ticks, never by walking the list;
a refresh does not touch the queue beyond settling its front.
"""

from __future__ import annotations

import weakref
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional, Sequence

from impl.eviction_queue import EvictionQueue


class Link:
    """One node's membership in one LRU list. It refers to its node weakly: a node owns its
    links, so a strong reference back would make every node a reference cycle, reclaimed only by
    a full collection once it leaves the tree."""

    __slots__ = ("_node", "prev", "next", "tick")

    def __init__(self, node: Any = None):
        self._node = None if node is None else weakref.ref(node)
        self.prev: Optional[Link] = None
        self.next: Optional[Link] = None
        self.tick = -1

    @property
    def node(self) -> Any:
        """The node this link places (None for a list's head and tail)."""
        return None if self._node is None else self._node()

    @property
    def linked(self) -> bool:
        return self.prev is not None


class LRUList:
    """Nodes ordered from most (head) to least (tail) recently used.

    Invariant: `link.prev.next is link` and `link.next.prev is link` for every member, and ticks
    strictly decrease from head to tail. `evictable(node)` is the list's eviction rule (e.g.
    "unlocked leaf"); the owner calls `note_maybe_evictable` whenever a member may have started to
    satisfy it (an unlock, a last child removed); insertion offers a member itself, and a refresh
    does not change whether one satisfies it.
    """

    def __init__(self, link_attr: str, name: str, evictable: Callable[[Any], bool]):
        self.name = name
        self._link = attrgetter(link_attr)
        self._evictable = evictable
        self._queue = EvictionQueue(self._candidate_tick)
        self._head = Link()
        self._tail = Link()
        self._head.next = self._tail
        self._tail.prev = self._head
        self._size = 0
        self._clock = 0

    def __len__(self) -> int:
        return self._size

    def insert_mru(self, node: Any) -> None:
        """Add a node that is not in the list as most recently used."""
        link = self._link(node)
        if link.linked:
            raise ValueError(f"node {node.id} is already in the {self.name} LRU list")
        self._size += 1
        self._place_at_head(link)
        self.note_maybe_evictable(node)

    def reset_mru(self, node: Any) -> None:
        """Move a member to the most recently used position."""
        self.reset_path_mru((node,))

    def reset_path_mru(self, path: Sequence[Any]) -> None:
        """Move members to the head so that `path[0]` is most recent, then `path[1]`, and so on.

        This is the hottest list operation (every match and insert refreshes its whole path), hence
        one loop with the unlink and the placement at the head written out; the eviction queue
        re-keys a refreshed candidate lazily, when it reaches the front.
        """
        link_of = self._link
        head = self._head
        for node in reversed(path):
            link = link_of(node)
            prev, nxt = link.prev, link.next
            if prev is None:
                raise ValueError(f"node {node.id} is not in the {self.name} LRU list")
            prev.next = nxt
            nxt.prev = prev
            first = head.next
            link.prev = head
            link.next = first
            first.prev = link
            head.next = link
            self._clock += 1
            link.tick = self._clock
        self._queue.settle_front()

    def clear(self) -> None:
        """Take every member out (O(n)): no link is left pointing at another."""
        link = self._head.next
        while link is not self._tail:
            following = link.next
            link.prev = link.next = None
            link = following
        self._head.next = self._tail
        self._tail.prev = self._head
        self._size = 0
        self._queue = EvictionQueue(self._candidate_tick)

    def remove(self, node: Any) -> None:
        """Take a member out of the list."""
        link = self._link(node)
        if not link.linked:
            raise ValueError(f"node {node.id} is not in the {self.name} LRU list")
        self._unlink(link)
        link.prev = link.next = None
        self._size -= 1

    def note_maybe_evictable(self, node: Any) -> None:
        """Offer `node` to the eviction queue if it is a member satisfying the eviction rule. The
        owner calls it whenever a member may have started to satisfy the rule (see the class)."""
        link = self._link(node)
        if link.linked and self._evictable(node):
            self._queue.offer(node, link.tick)
            self._queue.compact(self._size)

    def pop_lru_evictable(self) -> Optional[Any]:
        """The least recently used member satisfying the eviction rule, or None.

        The member stays in the list; the caller evicts it (and so removes it) or re-offers it.
        """
        return self._queue.pop_lru()

    def _candidate_tick(self, node: Any) -> Optional[int]:
        link = self._link(node)
        return link.tick if link.prev is not None and self._evictable(node) else None

    def iter_mru_to_lru(self) -> Iterator[Any]:
        """Members from most to least recently used (O(n); for checks and printing)."""
        link = self._head.next
        while link is not self._tail:
            yield link.node
            link = link.next

    def links_consistent(self) -> bool:
        """Whether prev/next agree both ways and ticks strictly decrease (O(n); for checks)."""
        count = 0
        link = self._head
        while link.next is not self._tail:
            nxt = link.next
            if nxt is None or nxt.prev is not link:
                return False
            if link is not self._head and nxt.tick >= link.tick:
                return False
            link = nxt
            count += 1
        return self._tail.prev is link and count == self._size

    def _place_at_head(self, link: Link) -> None:
        self._clock += 1
        link.tick = self._clock
        first = self._head.next
        link.prev = self._head
        link.next = first
        first.prev = link
        self._head.next = link

    @staticmethod
    def _unlink(link: Link) -> None:
        link.prev.next = link.next
        link.next.prev = link.prev
