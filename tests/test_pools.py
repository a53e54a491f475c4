"""Unit tests of the three pools: hand-out order, exhaustion, reserved slots, debug refusals."""

import pytest
import torch

from impl import HybridReqToTokenPool, MambaPool, Req, SlotError, TokenToKVPoolAllocator


def test_kv_alloc_hands_out_slots_from_one_and_never_zero(device):
    kv = TokenToKVPoolAllocator(5, device=device, debug=True)
    first = kv.alloc(3)
    rest = kv.alloc(2)
    assert first.dtype == torch.int64 and first.device.type == device.type
    assert first.tolist() == [1, 2, 3] and rest.tolist() == [4, 5]
    assert kv.available_size() == 0


def test_kv_alloc_returns_none_when_short_and_changes_nothing(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    kv.alloc(3)
    assert kv.alloc(2) is None
    assert kv.available_size() == 1
    assert kv.alloc(1).tolist() == [4]


def test_kv_free_returns_slots_to_the_tail(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    got = kv.alloc(4)
    kv.free(got[1:3])
    assert kv.available_size() == 2
    assert kv.alloc(2).tolist() == [2, 3]


@pytest.mark.parametrize(
    "bad, message",
    [
        ([0], r"slot\(s\) \[0\] freed but not allocated"),
        ([2], r"slot\(s\) \[2\] freed but not allocated"),
        ([1, 1], r"slot\(s\) \[1\] freed twice in one call"),
        ([9], r"slot\(s\) \[9\] outside 0..4 freed"),
    ],
)
def test_kv_debug_refuses_bad_frees_and_changes_nothing(device, bad, message):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    kv.alloc(1)
    before = kv.free_slots.tolist()
    with pytest.raises(SlotError, match=message):
        kv.free(torch.tensor(bad, device=device))
    assert kv.free_slots.tolist() == before


def test_kv_debug_refuses_double_free_across_calls(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    got = kv.alloc(2)
    kv.free(got)
    with pytest.raises(SlotError, match=r"\[1, 2\] freed but not allocated"):
        kv.free(got)


def test_kv_debug_refuses_handing_out_the_reserved_slot(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    kv.free_pages = torch.tensor([0, 1], device=device)
    with pytest.raises(SlotError, match=r"reserved slot\(s\) \[0\] handed out"):
        kv.alloc(1)


def test_kv_without_debug_does_not_check(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=False)
    kv.free(torch.tensor([2], device=device))
    assert kv.available_size() == 5


def test_kv_debug_default_is_on_for_cpu_and_off_for_cuda():
    assert TokenToKVPoolAllocator(2, device="cpu").debug is True
    assert TokenToKVPoolAllocator(2, device="meta").debug is True
    from impl.slot_ledger import debug_default

    assert debug_default(torch.device("cuda")) is False


def test_a_bare_cuda_device_names_the_current_one(monkeypatch):
    # a cuda tensor reports cuda:N, and torch.device("cuda") != torch.device("cuda:0")
    from impl.slot_ledger import as_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert as_device("cuda") == torch.device("cuda", 3)
    assert as_device("cuda:1") == torch.device("cuda", 1)
    assert as_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_cuda_pool_without_cuda_is_refused_naming_the_device():
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available here"):
        TokenToKVPoolAllocator(8, device="cuda")


def test_kv_need_sort_merges_released_slots_sorted(device):
    kv = TokenToKVPoolAllocator(4, device=device, need_sort=True, debug=True)
    got = kv.alloc(4)
    kv.free(got[[3, 1]])
    assert kv.available_size() == 2 and len(kv.free_pages) == 0 and kv.release_pages.tolist() == [4, 2]
    assert kv.alloc(2).tolist() == [2, 4]


def test_kv_free_group_defers_until_the_end(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    got = kv.alloc(3)
    kv.free_group_begin()
    kv.free(got[:1])
    kv.free(got[2:])
    assert kv.available_size() == 1
    kv.free_group_end()
    assert kv.available_size() == 3
    assert kv.alloc(3).tolist() == [4, 1, 3]


def test_kv_free_group_keeps_its_own_copy_of_what_is_freed(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    row = kv.alloc(3)  # stands for a request row the scheduler frees from, then reuses
    kv.free_group_begin()
    kv.free(row[:2])
    row.fill_(4)  # the row is reused before the group ends
    kv.free_group_end()
    assert kv.alloc(3).tolist() == [4, 1, 2]


def test_kv_payload_round_trips(device):
    kv = TokenToKVPoolAllocator(4, device=device, payload_width=2, debug=True)
    slots = kv.alloc(2)
    kv.write_payload(slots, torch.tensor([[7, 8], [9, 10]]))
    assert kv.read_payload(slots).tolist() == [[7, 8], [9, 10]]
    assert kv.read_payload(torch.tensor([0, 3])).tolist() == [[0, 0], [0, 0]]


def test_kv_clear_frees_everything(device):
    kv = TokenToKVPoolAllocator(3, device=device, debug=True)
    kv.alloc(3)
    kv.clear()
    assert kv.alloc(3).tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(size=0), r"positive int, got 0"),
        (dict(size=True), r"positive int, got True"),
        (dict(size=4, dtype="cpu"), r"dtype must be a torch.dtype .* got 'cpu'"),
        (dict(size=4, payload_width=0), r"payload_width must be positive, got 0"),
        (dict(size=4, device="gpu0"), r"not a torch device: 'gpu0'"),
    ],
)
def test_kv_bad_construction_is_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TokenToKVPoolAllocator(**kwargs)


def test_kv_bad_alloc_size_is_named(device):
    kv = TokenToKVPoolAllocator(3, device=device)
    with pytest.raises(ValueError, match=r"non-negative int, got -1"):
        kv.alloc(-1)


def test_mamba_pool_hands_out_zero_to_size_minus_one_then_none(device):
    pool = MambaPool(3, device, conv_shape=(2,), temporal_shape=(3,), debug=True)
    assert pool.alloc(2).tolist() == [0, 1]
    assert pool.alloc(2) is None
    assert pool.alloc(1).tolist() == [2]
    assert pool.available_size() == 0
    assert pool.mamba_cache.conv.shape == (1, 4, 2)
    assert pool.mamba_cache.temporal.shape == (1, 4, 3)


def test_mamba_free_zeroes_the_state(device):
    pool = MambaPool(2, device, debug=True)
    slot = pool.alloc(1)
    pool.fill(slot, 5.0)
    assert pool.mamba_cache.conv[:, slot].eq(5.0).all()
    pool.free(slot)
    assert pool.mamba_cache.conv[:, slot].eq(0).all()
    assert pool.mamba_cache.temporal[:, slot].eq(0).all()
    assert pool.available_size() == 2


def test_mamba_fork_from_copies_the_state_into_a_new_slot(device):
    pool = MambaPool(2, device, num_layers=2, debug=True)
    src = pool.alloc(1)
    pool.fill(src, 3.5)
    dst = pool.fork_from(src)
    assert dst.tolist() == [1]
    assert pool.mamba_cache.conv[:, dst].eq(3.5).all()
    assert pool.mamba_cache.temporal[:, dst].eq(3.5).all()
    assert pool.fork_from(src) is None


def test_mamba_copy_from_copies_slot_by_slot(device):
    pool = MambaPool(4, device, debug=True)
    slots = pool.alloc(4)
    pool.fill(slots[:1], 1.0)
    pool.fill(slots[1:2], 2.0)
    pool.copy_from(slots[:2], slots[2:])
    assert pool.mamba_cache.conv[0, 2:4, 0].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"2 source slots but 1 destinations"):
        pool.copy_from(slots[:2], slots[3:])


def test_mamba_debug_refuses_double_free_and_the_padding_slot(device):
    pool = MambaPool(2, device, debug=True)
    slot = pool.alloc(1)
    pool.free(slot)
    with pytest.raises(SlotError, match=r"Mamba pool: slot\(s\) \[0\] freed but not allocated"):
        pool.free(slot)
    pool.free_slots = torch.tensor([2], device=device)
    with pytest.raises(SlotError, match=r"reserved slot\(s\) \[2\] handed out"):
        pool.alloc(1)


def test_req_pool_gives_mamba_slots_only_to_requests_without_one(device):
    pool = HybridReqToTokenPool(size=3, mamba_size=3, max_context_len=8, device=device, debug=True)
    has_one, lacks_one = Req("a", [1]), Req("b", [2])
    has_one.mamba_pool_idx = pool.mamba_pool.alloc(1)[0]
    slots = pool.alloc(2, [has_one, lacks_one])
    assert slots == [0, 1]
    assert int(has_one.mamba_pool_idx) == 0 and int(lacks_one.mamba_pool_idx) == 1
    assert pool.get_mamba_indices(torch.tensor(slots)).tolist() == [0, 1]
    assert pool.mamba_pool.available_size() == 1


def test_req_pool_alloc_fails_whole_when_mamba_is_short(device):
    pool = HybridReqToTokenPool(size=3, mamba_size=1, max_context_len=8, device=device, debug=True)
    reqs = [Req("a", [1]), Req("b", [2])]
    assert pool.alloc(2, reqs) is None
    assert pool.available_size() == 3 and pool.mamba_pool.available_size() == 1
    assert all(req.mamba_pool_idx is None for req in reqs)


def test_req_pool_alloc_fails_when_request_slots_are_short(device):
    pool = HybridReqToTokenPool(size=1, mamba_size=2, max_context_len=8, device=device, debug=True)
    assert pool.alloc(1, [Req("a", [1])]) is not None
    assert pool.alloc(1, [Req("b", [1])]) is None
    assert pool.mamba_pool.available_size() == 1


def test_req_pool_free_with_and_without_mamba(device):
    pool = HybridReqToTokenPool(size=2, mamba_size=2, max_context_len=8, device=device, debug=True)
    a, b = Req("a", [1]), Req("b", [2])
    (slot_a,) = pool.alloc(1, [a])
    (slot_b,) = pool.alloc(1, [b])
    pool.free(slot_a)
    assert pool.mamba_pool.available_size() == 1
    pool.free(slot_b, free_mamba_cache=False)
    assert pool.mamba_pool.available_size() == 1
    assert pool.available_size() == 2
    with pytest.raises(SlotError, match=r"request pool: slot\(s\) \[1\] freed but not allocated"):
        pool.free(slot_b)


def test_req_pool_write_fills_the_row(device):
    pool = HybridReqToTokenPool(size=2, mamba_size=2, max_context_len=8, device=device, debug=True)
    (slot,) = pool.alloc(1, [Req("a", [1])])
    pool.write((slot, slice(2, 5)), torch.tensor([7, 8, 9], dtype=torch.int32, device=device))
    assert pool.req_to_token[slot].tolist() == [0, 0, 7, 8, 9, 0, 0, 0]


def test_req_pool_alloc_needs_one_request_per_slot(device):
    pool = HybridReqToTokenPool(size=2, mamba_size=2, max_context_len=8, device=device)
    with pytest.raises(ValueError, match=r"alloc\(2\) needs exactly 2 reqs, got 1"):
        pool.alloc(2, [Req("a", [1])])


def test_req_pool_clear_frees_both_pools(device):
    pool = HybridReqToTokenPool(size=2, mamba_size=2, max_context_len=8, device=device, debug=True)
    pool.alloc(2, [Req("a", [1]), Req("b", [2])])
    pool.clear()
    assert pool.available_size() == 2 and pool.mamba_pool.available_size() == 2


@pytest.mark.gpu
def test_pools_live_on_cuda_and_skip_debug_syncs():
    kv = TokenToKVPoolAllocator(8, device="cuda")
    pool = HybridReqToTokenPool(size=2, mamba_size=2, max_context_len=8, device="cuda")
    assert kv.debug is False and pool.debug is False
    # "cuda" names the current device, so a pool's device equals its tensors' (cuda:N)
    assert kv.alloc(2).device == kv.device
    assert pool.mamba_pool.alloc(1).device == pool.mamba_pool.device == pool.device


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: MambaPool(0), r"Mamba pool size must be a positive int, got 0"),
        (lambda: MambaPool(2, num_layers=0), r"num_layers must be positive, got 0"),
        (lambda: HybridReqToTokenPool(0, 2, 8), r"request pool size must be a positive int, got 0"),
        (lambda: HybridReqToTokenPool(2, 2, 0), r"max_context_len must be a positive int, got 0"),
    ],
)
def test_bad_pool_construction_is_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_mamba_pool_takes_index_lists_and_ignores_empty_frees(device):
    pool = MambaPool(3, device, debug=True)
    pool.alloc(2)
    pool.free([])
    pool.free([1, 0])
    assert pool.free_slots.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match=r"non-negative int, got -2"):
        pool.alloc(-2)


def test_pools_without_debug_skip_the_ledger(device):
    kv = TokenToKVPoolAllocator(3, device=device, debug=False)
    assert kv.alloc(2).tolist() == [1, 2]
    kv.clear()
    pool = HybridReqToTokenPool(2, 2, 8, device=device, debug=False)
    (slot,) = pool.alloc(1, [Req("a", [1])])
    pool.free([slot])
    pool.free(slot)
    assert pool.available_size() == 3
    pool.clear()
    pool.mamba_pool.clear()
    assert pool.available_size() == 2


def test_ledger_refuses_a_slot_handed_out_twice(device):
    pool = MambaPool(3, device, debug=True)
    pool.alloc(1)
    pool.free_slots = torch.tensor([0, 1], device=device)
    with pytest.raises(SlotError, match=r"slot\(s\) \[0\] handed out twice"):
        pool.alloc(1)


def test_ledger_refuses_a_slot_outside_the_pool_handed_out(device):
    pool = MambaPool(3, device, debug=True)
    pool.free_slots = torch.tensor([7, 1], device=device)
    with pytest.raises(SlotError, match=r"slot\(s\) \[7\] outside 0..3 handed out"):
        pool.alloc(1)
    assert pool.available_size() == 2


def test_ledger_refuses_a_slot_handed_out_twice_in_one_call(device):
    pool = MambaPool(3, device, debug=True)
    pool.free_slots = torch.tensor([2, 2], device=device)
    with pytest.raises(SlotError, match=r"slot\(s\) \[2\] handed out twice in one call"):
        pool.alloc(2)


def test_kv_extras_behave_as_sglang(device):
    kv = TokenToKVPoolAllocator(3, device=device, kvcache="kv-buffers", need_sort=True, debug=True)
    assert kv.get_kvcache() == "kv-buffers"
    kv.merge_and_sort_free()
    assert kv.free_pages.tolist() == [1, 2, 3]
    kv.free_group_begin()
    kv.free_group_end()
    kv.free(torch.empty((0,), dtype=torch.int64, device=device))
    assert kv.available_size() == 3


def test_req_pool_alloc_of_nothing_gives_nothing(device):
    pool = HybridReqToTokenPool(2, 2, 8, device=device, debug=True)
    assert pool.alloc(0) == []
    pool.free([])
    assert pool.available_size() == 2


def test_pools_keep_what_is_freed_even_when_the_caller_reuses_its_tensor():
    kv = TokenToKVPoolAllocator(8, device="cpu")
    row = torch.zeros(8, dtype=torch.int32)
    row[:3] = kv.alloc(3).to(torch.int32)  # a request row, as req_to_token holds it
    slots = kv.alloc(5)
    kv.free(row[:3])  # cast to int64: the pool's own copy
    kv.free(slots)  # already int64: copied by the pool
    row.fill_(0)
    slots.fill_(0)
    assert kv.alloc(8).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]

    mamba = MambaPool(4, "cpu")
    taken = mamba.alloc(4)
    mamba.free(taken[:2])
    mamba.free(taken[2:].to(torch.int32))
    taken.fill_(0)
    assert mamba.alloc(4).tolist() == [0, 1, 2, 3]


def test_mamba_pool_refuses_empty_state_shapes():
    with pytest.raises(ValueError, match=r"shapes must be positive, got conv \(2, 0\) and temporal \(2,\)"):
        MambaPool(4, "cpu", conv_shape=(2, 0))


def test_kv_free_takes_an_index_of_any_shape():
    kv = TokenToKVPoolAllocator(4, device="cpu")
    slots = kv.alloc(4)
    kv.free(slots.reshape(2, 2))
    assert kv.alloc(4).tolist() == [1, 2, 3, 4]


def test_req_repr_names_its_slot_and_lengths():
    req = Req(7, [1, 2, 3])
    assert repr(req) == "Req(rid=7, input=3, output=0, req_pool_idx=None, prefix=0)"


@pytest.mark.parametrize(
    "free_index, message",
    [
        ("slots", r"free: expected slot indices, got 'slots'"),
        ([[1, 2], [3]], r"free: expected slot indices, got \[\[1, 2\], \[3\]\]"),
        (torch.tensor([1.0]), r"free: slot indices must be integers, got a torch.float32 tensor"),
    ],
)
def test_kv_free_refuses_what_is_not_slot_indices(device, free_index, message):
    from impl import CacheMisuseError

    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    taken = kv.alloc(2)
    with pytest.raises(CacheMisuseError, match=message):
        kv.free(free_index)
    assert kv.available_size() == 2 and kv.free_slots.tolist() == [3, 4] and taken.tolist() == [1, 2]


def test_kv_free_takes_a_list_of_slots(device):
    kv = TokenToKVPoolAllocator(4, device=device, debug=True)
    kv.alloc(2)
    kv.free([2, 1])
    assert kv.available_size() == 4
