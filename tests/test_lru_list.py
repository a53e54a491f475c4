"""Unit tests of the intrusive LRU list and the eviction queue it answers from."""

import pytest
from hypothesis import given, settings, strategies as st

from impl.lru_list import Link, LRUList


class Item:
    def __init__(self, id, evictable=True):
        self.id = id
        self.link = Link(self)
        self.evictable = evictable


def make(evictable=lambda item: item.evictable):
    return LRUList("link", "test", evictable)


def order(lst):
    return [item.id for item in lst.iter_mru_to_lru()]


def test_insert_reset_remove_keep_mru_first_and_links_consistent():
    lst = make()
    a, b, c = Item(1), Item(2), Item(3)
    for item in (a, b, c):
        lst.insert_mru(item)
    assert order(lst) == [3, 2, 1] and len(lst) == 3
    lst.reset_mru(a)
    assert order(lst) == [1, 3, 2]
    lst.remove(c)
    assert order(lst) == [1, 2] and len(lst) == 2 and not c.link.linked
    assert lst.links_consistent()


def test_reset_path_puts_the_first_element_most_recent():
    lst = make()
    items = [Item(i) for i in range(4)]
    for item in items:
        lst.insert_mru(item)
    lst.reset_path_mru([items[0], items[1]])
    assert order(lst) == [0, 1, 3, 2]


@pytest.mark.parametrize("call, message", [
    (lambda lst, x, y: lst.insert_mru(x), r"node 1 is already in the test LRU list"),
    (lambda lst, x, y: lst.reset_mru(y), r"node 2 is not in the test LRU list"),
    (lambda lst, x, y: lst.remove(y), r"node 2 is not in the test LRU list"),
])
def test_misuse_names_the_node(call, message):
    lst = make()
    inside, outside = Item(1), Item(2)
    lst.insert_mru(inside)
    with pytest.raises(ValueError, match=message):
        call(lst, inside, outside)


def test_links_consistent_detects_a_broken_back_link_and_tick_order():
    lst = make()
    a, b = Item(1), Item(2)
    lst.insert_mru(a)
    lst.insert_mru(b)
    a.link.prev = a.link
    assert not lst.links_consistent()
    a.link.prev = b.link
    a.link.tick = b.link.tick + 1
    assert not lst.links_consistent()


def test_pop_lru_evictable_skips_members_that_are_not_evictable_in_lru_order():
    lst = make()
    items = [Item(i, evictable=(i % 2 == 0)) for i in range(6)]
    for item in items:
        lst.insert_mru(item)
    assert lst.pop_lru_evictable().id == 0
    lst.remove(items[0])
    lst.reset_mru(items[2])
    assert lst.pop_lru_evictable().id == 4
    items[1].evictable = True
    lst.note_maybe_evictable(items[1])
    assert lst.pop_lru_evictable().id == 1


def test_eviction_queue_drops_stale_offers_when_compacting():
    lst = make()
    item = Item(1)
    lst.insert_mru(item)
    for _ in range(500):
        lst.reset_mru(item)
    assert len(lst._queue._heap) <= 2 * len(lst) + 65
    assert lst.pop_lru_evictable() is item
    assert lst.pop_lru_evictable() is None


def test_a_backlog_of_entries_is_settled_as_paths_are_refreshed_not_by_one_pop():
    from impl.eviction_queue import EvictionQueue

    checks = []
    current = {}

    def current_tick(node):
        checks.append(node.id)
        return current.get(node.id)

    queue = EvictionQueue(current_tick)
    nodes = [Item(i) for i in range(50)]
    for tick, node in enumerate(nodes):
        queue.offer(node, tick)
    current[49] = 49  # the other 49 stopped being candidates (locked, or given a child)
    queue.settle_front()
    checks.clear()
    assert queue.pop_lru() is nodes[49]
    assert checks == [49]


def test_a_refresh_adds_no_entry_and_the_front_is_rekeyed_to_its_current_tick():
    lst = make()
    a, b, c = Item(1), Item(2), Item(3)
    for item in (a, b, c):
        lst.insert_mru(item)
    for _ in range(100):
        lst.reset_path_mru([a, b])
    assert len(lst._queue) == 3
    assert lst.pop_lru_evictable() is c
    lst.remove(c)
    assert lst.pop_lru_evictable() is b  # offered before its refreshes, it comes out by its current tick
    lst.remove(b)
    assert lst.pop_lru_evictable() is a


def test_stale_offers_behind_a_current_one_are_compacted_away():
    lst = make()
    oldest, busy = Item(1), Item(2)
    lst.insert_mru(oldest)
    lst.insert_mru(busy)
    for _ in range(500):  # each refresh leaves a stale offer behind `oldest`'s current one
        lst.reset_mru(busy)
    assert len(lst._queue._heap) <= 2 * len(lst) + 65
    assert lst.pop_lru_evictable() is oldest
    assert lst.pop_lru_evictable() is busy
    assert lst.pop_lru_evictable() is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "refresh", "remove", "toggle", "pop"]),
                          st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True)), max_size=80))
def test_pops_agree_with_a_plain_list_model(operations):
    """Oracle: a Python list, most recent first; the LRU candidate is its last evictable member."""
    lst = make()
    items = [Item(i, evictable=True) for i in range(8)]
    model = []
    for op, ids in operations:
        if op == "insert":
            for i in ids:
                if i not in model:
                    lst.insert_mru(items[i])
                    model.insert(0, i)
        elif op == "refresh":
            path = [i for i in ids if i in model]
            lst.reset_path_mru([items[i] for i in path])
            model = path + [i for i in model if i not in path]
        elif op == "remove":
            for i in ids:
                if i in model:
                    lst.remove(items[i])
                    model.remove(i)
        elif op == "toggle":
            for i in ids:
                items[i].evictable = not items[i].evictable
                if items[i].evictable:
                    lst.note_maybe_evictable(items[i])
        else:
            expected = next((i for i in reversed(model) if items[i].evictable), None)
            got = lst.pop_lru_evictable()
            assert (None if got is None else got.id) == expected
            if got is not None:
                lst.remove(got)
                model.remove(got.id)
        assert [item.id for item in lst.iter_mru_to_lru()] == model
        assert lst.links_consistent()
        assert len(lst._queue) <= 2 * len(lst) + 64 + 1


def test_offers_of_a_queued_member_are_compacted_to_one_entry_per_candidate():
    lst = make()
    keep, gone = Item(1), Item(2)
    lst.insert_mru(keep)
    lst.insert_mru(gone)
    for _ in range(100):  # each unlock of a member still queued adds an entry
        lst.note_maybe_evictable(keep)
    gone.evictable = False
    for _ in range(100):
        lst.note_maybe_evictable(keep)
    assert len(lst._queue) <= 2 * len(lst) + 64
    assert lst.pop_lru_evictable() is keep
