"""The model's paged KV (page size > 1): keys go in and match whole pages, the pool hands out and
takes back whole pages, a request's extend fills its last page before it takes new ones."""

from reference import SGLANG_UNIFIED, ReferenceCache


def model(kv_size: int = 32, page_size: int = 4) -> ReferenceCache:
    return ReferenceCache(kv_size=kv_size, mamba_size=8, req_size=2, rules=SGLANG_UNIFIED, page_size=page_size)


def test_the_pool_is_whole_pages_after_the_padding_page():
    m = model(kv_size=16)
    assert list(m.kv_slots) == list(range(4, 20)) and m.kv_free == list(range(4, 20))


def test_keys_go_in_and_match_whole_pages_only():
    m = model()
    kv = tuple(range(4, 14))  # ten tokens' slots: two whole pages and two tokens
    assert m.insert(tuple(range(10)), None, kv, mamba=1) == (0, False)
    assert list(m.nodes) == [(None, tuple(range(8)))] and m.nodes[(None, tuple(range(8)))].kv == kv[:8]
    assert "key cut to whole pages" in m.events
    assert m.match_prefix((0, 1, 2), None) == ((), (None, ())) and "sub-page prompt" in m.events
    # a key sharing six tokens shares one page: the node splits after it, not after six
    matched, last = m.match_prefix((0, 1, 2, 3, 4, 5, 9, 9), None)
    assert matched == () and (None, (0, 1, 2, 3)) in m.nodes and "paged split" in m.events
    assert m.nodes[(None, (0, 1, 2, 3))].mamba is None  # the upper part is a tombstone


def test_an_extend_fills_the_last_page_then_takes_new_pages_in_batch_order():
    m = model()
    first = m.kv_alloc_extend([0], [6], [-1])
    assert first == [4, 5, 6, 7, 8, 9]  # pages 1 and 2, the second half full
    # the same request goes on from slot 9, a second one starts fresh
    assert m.kv_alloc_extend([6, 0], [11, 3], [9, -1]) == [10, 11, 12, 13, 14, 16, 17, 18]
    assert "extend into a partial page" in m.events
    assert m.kv_free == list(range(20, 36))


def test_an_allocation_short_of_pages_hands_out_nothing_and_changes_nothing():
    m = model(kv_size=8)
    assert m.kv_alloc_extend([0], [9], [-1]) is None and m.kv_free == list(range(4, 12))
    assert m.kv_alloc_extend([0, 0], [4, 4], [-1, -1]) == list(range(4, 12))
    assert m.kv_alloc_decode([5, 3], [7, 10]) is None  # the first needs a new page, none is free
    assert m.kv_alloc_decode([3, 4], [5, 10]) == [6, 11]  # both go on in their pages


def test_a_decode_starts_a_page_only_on_a_page_boundary():
    m = model()
    assert m.kv_alloc_decode([5, 7], [7, 21]) == [4, 22]
    assert "decode starts a page" in m.events


def test_freeing_any_slot_of_a_page_frees_the_page_to_the_head_in_the_slots_order():
    m = model(kv_size=16)
    m.kv_free = list(range(12, 20))  # pages 1 and 2 handed out
    m.free_kv([9, 4, 5])  # a row whose pages are 2, then 1
    assert m.kv_free == [8, 9, 10, 11, 4, 5, 6, 7] + list(range(12, 20))


def test_a_free_group_frees_its_slots_pages_then_its_page_ids_when_it_ends():
    m = model(kv_size=16)
    m.kv_free = []
    m.free_group_begin()
    m.free_pages([3])
    m.free_kv([5])
    assert m.kv_free == []
    m.free_group_end()
    assert m.kv_free == [12, 13, 14, 15, 4, 5, 6, 7]


def test_which_free_pages_an_allocation_takes_is_the_allocators_but_they_must_be_free():
    m = model(kv_size=16)
    assert m.kv_alloc_extend([0], [5], [-1], chosen=[3, 1]) == [12, 13, 14, 15, 4]
    assert sorted(m.kv_free) == list(range(8, 12)) + list(range(16, 20))
    assert m.kv_alloc_decode([5], [7], chosen=[1]) is None  # page 1 is not free: the model hands out nothing
    assert m.kv_alloc(4, chosen=[4]) == [16, 17, 18, 19] and m.kv_alloc(4, chosen=[4]) is None
