"""Hand-written scenarios, one per rule of the cache, each asserting exact trees, sizes and pools.

A tree is written as {path: (kind, full_lock, mamba_lock)}: `path` is the token tuple from the root
to the end of the node (so the set of paths fixes the segments), kind "M" for a Mamba holder and
"T" for a tombstone.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from impl import (
    CacheMisuseError,
    HybridReqToTokenPool,
    MambaPoolExhaustedError,
    MambaRadixCache,
    RadixKey,
    Req,
    SlotError,
    TokenToKVPoolAllocator,
)


class Setup:
    def __init__(self, device, kv_size=32, mamba_size=8, req_size=4):
        self.device = device
        self.kv = TokenToKVPoolAllocator(kv_size, device=device, debug=True)
        self.pool = HybridReqToTokenPool(
            size=req_size, mamba_size=mamba_size, max_context_len=64, device=device, debug=True
        )
        self.mamba = self.pool.mamba_pool
        self.cache = MambaRadixCache(self.pool, self.kv)

    def insert(self, tokens, extra_key=None):
        """Insert `tokens` with fresh KV slots and a fresh Mamba slot; return insert's result."""
        kv = self.kv.alloc(len(tokens))
        mamba = self.mamba.alloc(1)
        prefix_len, exist = self.cache.insert(RadixKey(tokens, extra_key), kv, mamba)
        self.kv.free(kv[:prefix_len])
        if exist:
            self.mamba.free(mamba)
        return prefix_len, exist

    def shape(self):
        out = {}
        stack = [(self.cache.root_node, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                extra = () if child.key.extra_key is None or path else (child.key.extra_key,)
                child_path = extra + path + tuple(child.key.token_ids)
                kind = "T" if child.mamba_value is None else "M"
                out[child_path] = (kind, child.full_lock_ref, child.mamba_lock_ref)
                stack.append((child, child_path))
        return out

    def sizes(self):
        c = self.cache
        return (
            c.full_evictable_size(),
            c.full_protected_size(),
            c.mamba_evictable_size(),
            c.mamba_protected_size(),
        )

    def lru(self, which="full"):
        lst = self.cache.full_lru_list if which == "full" else self.cache.mamba_lru_list
        return [tuple(n.key.token_ids) for n in lst.iter_mru_to_lru()]

    def free_counts(self):
        return self.kv.available_size(), self.mamba.available_size()


@pytest.fixture
def s(device):
    return Setup(device)


def test_insert_into_empty_tree_makes_one_holder(s):
    assert s.insert([1, 2, 3]) == (0, False)
    assert s.shape() == {(1, 2, 3): ("M", 0, 0)}
    assert s.sizes() == (3, 0, 1, 0)
    assert s.cache.total_size() == (3, 1)
    assert s.free_counts() == (29, 7)


def test_insert_extension_reports_the_cached_prefix(s):
    s.insert([1, 2, 3])
    assert s.insert([1, 2, 3, 4, 5]) == (3, False)
    assert s.shape() == {(1, 2, 3): ("M", 0, 0), (1, 2, 3, 4, 5): ("M", 0, 0)}
    assert s.sizes() == (5, 0, 2, 0)
    assert s.free_counts() == (27, 6)


def test_insert_of_a_cached_key_reports_mamba_exist(s):
    s.insert([1, 2, 3])
    assert s.insert([1, 2, 3]) == (3, True)
    assert s.shape() == {(1, 2, 3): ("M", 0, 0)}
    assert s.free_counts() == (29, 7)


def test_insert_of_empty_key_takes_nothing(s):
    mamba = s.mamba.alloc(1)
    assert s.cache.insert(RadixKey([]), s.kv.alloc(0), mamba) == (0, True)
    assert s.shape() == {}


def test_partial_match_splits_and_the_upper_part_is_a_tombstone(s):
    s.insert([1, 2, 3, 4])
    result = s.cache.match_prefix(RadixKey([1, 2, 9]))
    assert s.shape() == {(1, 2): ("T", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    assert result.device_indices.numel() == 0
    assert result.last_device_node is s.cache.root_node
    assert s.sizes() == (4, 0, 1, 0)
    assert s.lru("full") == [(3, 4), (1, 2)]
    assert s.lru("mamba") == [(3, 4)]


def test_match_returns_kv_only_up_to_the_deepest_holder(s):
    s.insert([1, 2, 3, 4])
    node = s.cache.root_node.children[1]
    kv = node.value.tolist()
    s.cache.match_prefix(RadixKey([1, 2, 9]))
    s.insert([1, 2, 3, 4, 5, 6])
    result = s.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 7]))
    assert result.device_indices.tolist() == kv
    assert tuple(result.last_device_node.key.token_ids) == (3, 4)
    assert s.shape() == {
        (1, 2): ("T", 0, 0),
        (1, 2, 3, 4): ("M", 0, 0),
        (1, 2, 3, 4, 5): ("T", 0, 0),
        (1, 2, 3, 4, 5, 6): ("M", 0, 0),
    }


def test_insert_onto_a_tombstone_makes_it_a_holder_again(s):
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 9]))
    assert s.insert([1, 2]) == (2, False)
    assert s.shape() == {(1, 2): ("M", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    assert s.sizes() == (4, 0, 2, 0)
    assert s.lru("mamba") == [(1, 2), (3, 4)]
    assert s.free_counts() == (28, 6)


def test_match_refreshes_the_node_ahead_of_its_ancestors(s):
    s.insert([1, 2])
    s.insert([1, 2, 3, 4])
    s.insert([7, 8])
    assert s.lru("full") == [(7, 8), (3, 4), (1, 2)]
    s.cache.match_prefix(RadixKey([1, 2, 3, 4]))
    assert s.lru("full") == [(3, 4), (1, 2), (7, 8)]
    assert s.lru("mamba") == [(3, 4), (1, 2), (7, 8)]


def test_extra_keys_never_share_nodes(s):
    s.insert([1, 2, 3], extra_key="lora-a")
    assert s.insert([1, 2, 3], extra_key="lora-b") == (0, False)
    assert s.insert([1, 2, 3]) == (0, False)
    assert s.shape() == {
        ("lora-a", 1, 2, 3): ("M", 0, 0),
        ("lora-b", 1, 2, 3): ("M", 0, 0),
        (1, 2, 3): ("M", 0, 0),
    }
    assert s.cache.match_prefix(RadixKey([1, 2, 3], "lora-a")).device_indices.numel() == 3
    assert s.cache.match_prefix(RadixKey([1, 2, 3], "lora-c")).device_indices.numel() == 0


def test_lock_counts_on_the_path_for_kv_and_on_the_node_for_mamba(s):
    s.insert([1, 2])
    s.insert([1, 2, 3, 4])
    leaf = s.cache.match_prefix(RadixKey([1, 2, 3, 4])).last_device_node
    s.cache.inc_lock_ref(leaf)
    s.cache.inc_lock_ref(leaf)
    assert s.shape() == {(1, 2): ("M", 2, 0), (1, 2, 3, 4): ("M", 2, 2)}
    assert s.sizes() == (0, 4, 1, 1)
    s.cache.dec_lock_ref(leaf)
    assert s.sizes() == (0, 4, 1, 1)
    s.cache.dec_lock_ref(leaf)
    assert s.shape() == {(1, 2): ("M", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    assert s.sizes() == (4, 0, 2, 0)


def test_split_of_a_locked_node_copies_its_kv_lock_to_the_upper_part(s):
    s.insert([1, 2, 3, 4])
    leaf = s.cache.root_node.children[1]
    s.cache.inc_lock_ref(leaf)
    s.cache.match_prefix(RadixKey([1, 2, 5]))
    assert s.shape() == {(1, 2): ("T", 1, 0), (1, 2, 3, 4): ("M", 1, 1)}
    assert s.sizes() == (0, 4, 0, 1)


def test_evict_takes_the_lru_unlocked_leaf_and_skips_locked_ones(s):
    s.insert([1, 2])
    s.insert([3, 4])
    s.insert([5, 6])
    locked = s.cache.match_prefix(RadixKey([1, 2])).last_device_node
    s.cache.inc_lock_ref(locked)
    s.cache.evict(1)
    assert s.shape() == {(1, 2): ("M", 1, 1), (5, 6): ("M", 0, 0)}
    assert s.sizes() == (2, 2, 1, 1)
    assert s.free_counts() == (28, 6)


def test_evict_deletes_tombstone_ancestors_left_as_leaves(s):
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 9]))
    s.cache.match_prefix(RadixKey([1, 2, 3, 4]))
    assert s.shape() == {(1, 2): ("T", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    s.cache.evict(1)
    assert s.shape() == {}
    assert s.sizes() == (0, 0, 0, 0)
    assert s.free_counts() == (32, 8)


def test_evict_cascade_stops_at_a_holder_which_becomes_evictable(s):
    s.insert([1, 2])
    s.insert([1, 2, 3, 4, 5])
    s.cache.match_prefix(RadixKey([1, 2, 3, 9]))
    s.insert([8, 8])
    assert s.shape() == {
        (1, 2): ("M", 0, 0),
        (1, 2, 3): ("T", 0, 0),
        (1, 2, 3, 4, 5): ("M", 0, 0),
        (8, 8): ("M", 0, 0),
    }
    s.cache.evict(3)
    assert s.shape() == {(1, 2): ("M", 0, 0), (8, 8): ("M", 0, 0)}
    assert s.free_counts() == (28, 6)
    s.cache.evict(1)
    assert s.shape() == {(8, 8): ("M", 0, 0)}
    assert s.free_counts() == (30, 7)


def test_evict_keeps_a_locked_tombstone_ancestor(s):
    s.insert([1, 2, 3, 4])
    s.insert([1, 2, 5, 6])
    locked = s.cache.match_prefix(RadixKey([1, 2, 5, 6])).last_device_node
    s.cache.inc_lock_ref(locked)
    s.cache.evict(10)
    assert s.shape() == {(1, 2): ("T", 1, 0), (1, 2, 5, 6): ("M", 1, 1)}
    assert s.sizes() == (0, 4, 0, 1)


def test_evict_mamba_tombstones_an_internal_holder(s):
    s.insert([1, 2])
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 3, 4]))
    s.cache.evict_mamba(1)
    assert s.shape() == {(1, 2): ("T", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    assert s.sizes() == (4, 0, 1, 0)
    assert s.free_counts() == (28, 7)
    assert s.lru("mamba") == [(3, 4)]


def test_evict_mamba_on_a_leaf_evicts_it_with_its_tombstone_ancestors(s):
    s.insert([1, 2])
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 3, 4]))
    s.cache.evict_mamba(2)
    assert s.shape() == {}
    assert s.free_counts() == (32, 8)


def test_evict_mamba_skips_locked_states(s):
    s.insert([1, 2])
    s.insert([3, 4])
    locked = s.cache.match_prefix(RadixKey([1, 2])).last_device_node
    s.cache.inc_lock_ref(locked)
    s.cache.evict_mamba(5)
    assert s.shape() == {(1, 2): ("M", 1, 1)}


def test_cow_mamba_allocates_a_slot_and_copies_the_state(s):
    s.insert([1, 2, 3])
    node = s.cache.root_node.children[1]
    s.mamba.fill(node.mamba_value, 4.25)
    req = Req("r", [1, 2, 3, 4])
    result = s.cache.match_prefix(RadixKey([1, 2, 3]), cow_mamba=True, req=req)
    assert result.last_device_node is node
    assert req.mamba_pool_idx is not None and int(req.mamba_pool_idx) != int(node.mamba_value[0])
    assert s.mamba.mamba_cache.conv[:, req.mamba_pool_idx].eq(4.25).all()
    assert s.free_counts() == (29, 6)


def test_cow_mamba_into_an_existing_slot_copies_without_allocating(s):
    s.insert([1, 2, 3])
    node = s.cache.root_node.children[1]
    s.mamba.fill(node.mamba_value, 2.0)
    req = Req("r", [1, 2, 3, 4])
    req.mamba_pool_idx = s.mamba.alloc(1)[0]
    s.cache.match_prefix(RadixKey([1, 2, 3]), cow_mamba=True, req=req)
    assert s.mamba.mamba_cache.temporal[:, req.mamba_pool_idx].eq(2.0).all()
    assert s.free_counts() == (29, 6)


def test_cow_mamba_without_a_holder_on_the_path_copies_nothing(s):
    s.insert([1, 2, 3, 4])
    req = Req("r", [1, 2, 5])
    result = s.cache.match_prefix(RadixKey([1, 2]), cow_mamba=True, req=req)
    assert result.last_device_node is s.cache.root_node
    assert req.mamba_pool_idx is None


def test_cow_mamba_with_a_full_pool_evicts_another_state(device):
    s = Setup(device, mamba_size=2)
    s.insert([1, 2])
    s.insert([5, 6])
    assert s.mamba.available_size() == 0
    req = Req("r", [5, 6, 7])
    result = s.cache.match_prefix(RadixKey([5, 6]), cow_mamba=True, req=req)
    assert tuple(result.last_device_node.key.token_ids) == (5, 6)
    assert s.shape() == {(5, 6): ("M", 0, 0)}
    assert req.mamba_pool_idx is not None
    assert s.free_counts() == (30, 0)


def test_cow_mamba_with_a_full_pool_of_locked_states_raises(device):
    s = Setup(device, mamba_size=1)
    s.insert([1, 2])
    node = s.cache.root_node.children[1]
    with pytest.raises(MambaPoolExhaustedError, match=r"no Mamba slot for request 'r'"):
        s.cache.match_prefix(RadixKey([1, 2]), cow_mamba=True, req=Req("r", [1, 2, 3]))
    assert s.shape() == {(1, 2): ("M", 0, 0)}
    assert node.full_lock_ref == 0


def start_request(s, tokens, extra_key=None):
    """What a scheduler does for a new request: match with cow, lock, request slot, KV, row."""
    req = Req(f"req-{tokens}", tokens, extra_key)
    req.fill_ids = list(tokens)
    match = s.cache.match_prefix(RadixKey(tokens[:-1], extra_key), cow_mamba=True, req=req)
    req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
    s.cache.inc_lock_ref(req.last_node)
    (req.req_pool_idx,) = s.pool.alloc(1, [req])
    prefix = len(req.prefix_indices)
    new_kv = s.kv.alloc(len(tokens) - prefix)
    s.pool.write((req.req_pool_idx, slice(0, prefix)), req.prefix_indices.to(torch.int32))
    s.pool.write((req.req_pool_idx, slice(prefix, len(tokens))), new_kv.to(torch.int32))
    return req


def decode(s, req, token):
    slot = s.kv.alloc(1)
    position = len(req.origin_input_ids) + len(req.output_ids) - 1
    s.pool.write((req.req_pool_idx, slice(position, position + 1)), slot.to(torch.int32))
    req.output_ids.append(token)


def test_chunked_prefill_caches_each_chunk_and_moves_the_lock(s):
    tokens = [1, 2, 3, 4, 5, 6]
    req = start_request(s, tokens)
    req.fill_ids = tokens[:3]
    s.cache.cache_unfinished_req(req, chunked=True)
    assert s.shape() == {(1, 2, 3): ("M", 1, 1)}
    assert len(req.prefix_indices) == 3
    req.fill_ids = tokens
    s.cache.cache_unfinished_req(req)
    assert s.shape() == {(1, 2, 3): ("M", 1, 0), (1, 2, 3, 4, 5, 6): ("M", 1, 1)}
    assert s.sizes() == (0, 6, 1, 1)
    assert s.free_counts() == (26, 5)
    row = s.pool.req_to_token[req.req_pool_idx, :6].tolist()
    assert row == req.prefix_indices.tolist()
    req.output_ids.append(7)
    decode(s, req, 8)
    s.cache.cache_finished_req(req)
    assert s.shape() == {
        (1, 2, 3): ("M", 0, 0),
        (1, 2, 3, 4, 5, 6): ("M", 0, 0),
        (1, 2, 3, 4, 5, 6, 7): ("M", 0, 0),
    }
    assert s.sizes() == (7, 0, 3, 0)
    assert s.free_counts() == (25, 5)
    assert s.pool.available_size() == 4


def test_chunked_prefill_across_a_split_reuses_the_tree_slots(s):
    s.insert([1, 2, 3, 4])
    owned = s.cache.root_node.children[1].value.tolist()
    req = start_request(s, [1, 2, 9, 9])
    assert len(req.prefix_indices) == 0
    req.fill_ids = [1, 2, 9]
    s.cache.cache_unfinished_req(req, chunked=True)
    assert s.shape() == {
        (1, 2): ("T", 1, 0),
        (1, 2, 3, 4): ("M", 0, 0),
        (1, 2, 9): ("M", 1, 1),
    }
    assert req.prefix_indices.tolist()[:2] == owned[:2]
    assert s.pool.req_to_token[req.req_pool_idx, :3].tolist() == req.prefix_indices.tolist()
    assert s.free_counts() == (32 - 4 - 4 + 2, 8 - 1 - 2)


def test_finished_request_with_a_cached_state_frees_its_own_mamba(s):
    s.insert([1, 2, 3])
    req = start_request(s, [1, 2, 3, 4])
    req.output_ids.append(5)
    before_mamba = s.mamba.available_size()
    s.cache.cache_finished_req(req)
    assert s.shape() == {(1, 2, 3): ("M", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}
    assert s.mamba.available_size() == before_mamba
    req2 = start_request(s, [1, 2, 3, 4])
    assert s.mamba.available_size() == before_mamba - 1
    req2.output_ids.append(5)
    s.cache.cache_finished_req(req2)
    assert s.mamba.available_size() == before_mamba
    assert s.shape() == {(1, 2, 3): ("M", 0, 0), (1, 2, 3, 4): ("M", 0, 0)}


def test_scheduler_evicts_on_shortage_then_allocates(device):
    s = Setup(device, kv_size=6)
    s.insert([1, 2, 3])
    s.insert([4, 5, 6])
    assert s.kv.alloc(4) is None
    s.cache.evict(4 - s.kv.available_size())
    assert s.kv.available_size() >= 4
    assert s.shape() == {}


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s, n: s.cache.dec_lock_ref(n), r"dec_lock_ref on node \d+ whose Mamba state is not locked"),
        (lambda s, n: s.cache.insert(RadixKey([1, 2, 3, 4, 5]), torch.tensor([1, 2]), torch.tensor([0])),
         r"value has 2 KV slots but the key has 5 tokens"),
        (lambda s, n: s.cache.insert(RadixKey([7]), torch.tensor([1])), r"mamba_value must be given"),
        (lambda s, n: s.cache.insert(RadixKey([7]), torch.tensor([1]), torch.tensor([0, 1])),
         r"exactly one Mamba slot, got 2"),
        (lambda s, n: s.cache.match_prefix([1, 2]), r"expected a RadixKey, got list"),
        (lambda s, n: s.cache.match_prefix(RadixKey([1]), cow_mamba=True), r"needs req="),
        (lambda s, n: s.cache.inc_lock_ref("node"), r"inc_lock_ref on a node that is not in the tree: 'node'"),
        (lambda s, n: s.cache.evict(2.5), r"evict: expected a non-negative number of slots, got 2.5"),
        (lambda s, n: s.cache.evict(-5), r"evict: expected a non-negative number of slots, got -5"),
        (lambda s, n: s.cache.evict_mamba(-5), r"evict_mamba: expected a non-negative number of slots, got -5"),
        (lambda s, n: s.cache.evict_mamba(True), r"evict_mamba: expected a non-negative number of slots, got True"),
        (lambda s, n: s.cache.insert(RadixKey([7, 8]), torch.tensor([1.0, 2.0]), torch.tensor([0])),
         r"value must be an integer index tensor, got torch.float32"),
        (lambda s, n: s.cache.insert(RadixKey([7]), torch.tensor([1]), torch.tensor([0.5])),
         r"mamba_value must be an integer index tensor, got torch.float32"),
        (lambda s, n: s.kv.free([63]), None),
    ],
)
def test_misuse_is_refused_and_changes_nothing(s, call, message):
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 5]))
    node = s.cache.root_node.children[1].children[3]
    before = (s.shape(), s.sizes(), s.lru("full"), s.lru("mamba"), s.free_counts())
    if message is None:  # a pool's misuse: SlotError, naming the slot
        with pytest.raises(SlotError, match=r"slot\(s\) \[63\] outside"):
            call(s, node)
    else:
        with pytest.raises(CacheMisuseError, match=message):
            call(s, node)
    assert (s.shape(), s.sizes(), s.lru("full"), s.lru("mamba"), s.free_counts()) == before


def test_dec_lock_ref_on_a_path_not_locked_is_refused_before_any_change(s):
    s.insert([1, 2])
    node = s.cache.root_node.children[1]
    s.cache.inc_lock_ref(node)
    node.parent  # root
    node.full_lock_ref = 0
    with pytest.raises(CacheMisuseError, match=r"node \d+ on its path is not locked"):
        s.cache.dec_lock_ref(node)
    assert node.mamba_lock_ref == 1


def test_evicted_node_is_refused_by_lock_calls(s):
    s.insert([1, 2])
    node = s.cache.root_node.children[1]
    s.cache.evict(2)
    with pytest.raises(CacheMisuseError, match=r"not in the tree"):
        s.cache.inc_lock_ref(node)


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([1, "2"], r"token '2' at position 1 is not an integer"),
        ([1.5], r"token 1.5 at position 0 is not an integer"),
        ([True], r"token True at position 0 is a bool"),
        (7, r"must be a sequence of ints, got 7"),
        ([-1, 2], r"token -1 at position 0 is negative"),
        ([3, torch.tensor(-2)], r"token tensor\(-2\) at position 1 is negative"),
    ],
)
def test_radix_key_refuses_non_integer_tokens(tokens, message):
    with pytest.raises(CacheMisuseError, match=message):
        RadixKey(tokens)


def test_radix_key_refuses_an_unhashable_extra_key():
    with pytest.raises(CacheMisuseError, match=r"extra_key must be hashable, got \[1\]"):
        RadixKey([1], extra_key=[1])


def test_a_cache_without_its_pools_is_refused():
    with pytest.raises(CacheMisuseError, match="needs a request-to-token pool and a KV allocator"):
        MambaRadixCache(None, None)


def test_radix_key_accepts_integer_like_tokens_and_slices_keep_the_namespace():
    key = RadixKey(torch.tensor([3, 4, 5]).tolist(), extra_key="x")
    assert key[1:].token_ids == [4, 5] and key[1:].extra_key == "x"
    assert key[0] == RadixKey([3], "x")
    assert len(key) == 3 and list(key) == [3, 4, 5]
    assert "extra_key='x'" in repr(key)


def test_page_size_other_than_one_is_refused_without_the_extra_buffer(device):
    s = Setup(device)
    with pytest.raises(CacheMisuseError, match=r"page_size=16 only with enable_mamba_extra_buffer"):
        MambaRadixCache(s.pool, s.kv, page_size=16)
    with pytest.raises(CacheMisuseError, match=r"page_size must be a positive int, got 0"):
        MambaRadixCache(s.pool, s.kv, page_size=0, enable_mamba_extra_buffer=True)


def paged(device, page_size=4):
    s = Setup(device)
    s.cache = MambaRadixCache(s.pool, s.kv, page_size=page_size, enable_mamba_extra_buffer=True)
    return s


def test_paged_insert_takes_whole_pages_and_matches_whole_pages(device):
    s = paged(device)
    assert s.insert([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == (0, False)
    assert s.shape() == {(1, 2, 3, 4, 5, 6, 7, 8): ("M", 0, 0)}  # the partial page stays the caller's
    assert s.sizes() == (8, 0, 1, 0)
    whole = s.cache.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert len(whole.device_indices) == 8
    # a key sharing six tokens of the node splits it after its first page, not inside the second
    assert s.insert([1, 2, 3, 4, 5, 6, 0, 0]) == (4, False)
    assert s.shape() == {
        (1, 2, 3, 4): ("T", 0, 0), (1, 2, 3, 4, 5, 6, 7, 8): ("M", 0, 0), (1, 2, 3, 4, 5, 6, 0, 0): ("M", 0, 0),
    }


def test_paged_children_are_told_apart_by_their_first_page(device):
    s = paged(device)
    s.insert([1, 2, 3, 4])
    s.insert([1, 2, 0, 0])  # the same first token, another first page: a sibling, no split
    assert s.shape() == {(1, 2, 3, 4): ("M", 0, 0), (1, 2, 0, 0): ("M", 0, 0)}
    assert len(s.cache.match_prefix(RadixKey([1, 2, 0, 0, 7])).device_indices) == 4
    assert len(s.cache.match_prefix(RadixKey([1, 2, 3])).device_indices) == 0  # less than a page
    s.cache.sanity_check()


def test_reset_forgets_the_tree(s):
    s.insert([1, 2])
    s.cache.reset()
    assert s.shape() == {} and s.sizes() == (0, 0, 0, 0) and s.lru() == []


def test_sanity_check_passes_and_format_tree_shows_locks_and_lru(s, capsys):
    s.insert([1, 2, 3, 4])
    s.cache.match_prefix(RadixKey([1, 2, 9]))
    s.cache.sanity_check()
    s.cache.pretty_print()
    out = capsys.readouterr().out
    assert "tombstone lock=0/0 lru=1/-" in out
    assert "tokens=[3, 4] mamba=0 lock=0/0 lru=0/0" in out
    assert "#full_tokens: 4, #mamba_num: 1" in out


def test_sanity_check_reports_a_broken_counter(s):
    from impl import CacheInvariantError

    s.insert([1, 2])
    s.cache.full_evictable_size_ += 1
    with pytest.raises(CacheInvariantError, match=r"size counters"):
        s.cache.sanity_check()


def test_all_values_flatten_lists_every_slot(s):
    s.insert([1, 2])
    s.insert([1, 2, 3])
    assert sorted(s.cache.all_values_flatten().tolist()) == [1, 2, 5]


def test_disabled_cache_matches_nothing_and_frees_finished_requests(device):
    s = Setup(device)
    cache = MambaRadixCache(s.pool, s.kv, disable=True)
    req = Req("r", [1, 2, 3])
    assert cache.match_prefix(RadixKey([1, 2])).last_device_node is cache.root_node
    (req.req_pool_idx,) = s.pool.alloc(1, [req])
    kv = s.kv.alloc(3)
    s.pool.write((req.req_pool_idx, slice(0, 3)), kv.to(torch.int32))
    req.fill_ids = [1, 2, 3]
    cache.cache_unfinished_req(req)
    assert req.prefix_indices.tolist() == kv.tolist()
    req.output_ids = [4]
    cache.cache_finished_req(req)
    assert s.free_counts() == (32, 8)
    assert cache.insert(RadixKey([1]), torch.tensor([1]), torch.tensor([0])) == (0, False)
    cache.evict(5)
    cache.evict_mamba(5)
    cache.inc_lock_ref(cache.root_node)
    cache.dec_lock_ref(cache.root_node)


def test_evictable_and_protected_size_tuples_point_to_the_split_api(s):
    with pytest.raises(NotImplementedError, match="full_evictable_size"):
        s.cache.evictable_size()
    with pytest.raises(NotImplementedError, match="full_protected_size"):
        s.cache.protected_size()


def test_sanity_check_names_each_broken_invariant(s):
    from impl import CacheInvariantError

    s.insert([1, 2])
    s.insert([1, 2, 3, 4])
    upper = s.cache.root_node.children[1]
    leaf = upper.children[3]

    leaf.full_lock_ref = 1
    with pytest.raises(CacheInvariantError, match=r"is locked but its parent \d+ is not"):
        s.cache.sanity_check()
    leaf.full_lock_ref, leaf.mamba_lock_ref = 0, 1
    with pytest.raises(CacheInvariantError, match=r"full_lock_ref=0, mamba_lock_ref=1"):
        s.cache.sanity_check()
    leaf.mamba_lock_ref = 0
    s.cache.mamba_lru_list.remove(leaf)
    with pytest.raises(CacheInvariantError, match=r"mamba LRU list does not hold exactly its 2 nodes"):
        s.cache.sanity_check()
    leaf.mamba_value = None
    with pytest.raises(CacheInvariantError, match=r"leaf node \d+ is a tombstone"):
        s.cache.sanity_check()
    with pytest.raises(CacheInvariantError, match=r"not an unlocked Mamba leaf"):
        s.cache.evict(2)


def test_request_calls_refuse_requests_without_slot_or_lock(s):
    s.insert([1, 2, 3])
    req = Req("r", [1, 2, 3, 4])
    req.last_node = s.cache.root_node
    with pytest.raises(CacheMisuseError, match=r"request 'r' has no request slot"):
        s.cache.cache_finished_req(req)
    req.req_pool_idx = 0
    req.last_node = s.cache.root_node.children[1]
    with pytest.raises(CacheMisuseError, match=r"does not hold a lock on its last node"):
        s.cache.cache_unfinished_req(req)
    with pytest.raises(CacheMisuseError, match=r"already has request slot 0"):
        s.cache.match_prefix(RadixKey([1, 2, 3]), cow_mamba=True, req=req)
    assert s.shape() == {(1, 2, 3): ("M", 0, 0)}


def test_insert_without_value_uses_the_token_ids(s):
    mamba = s.mamba.alloc(1)
    assert s.cache.insert(RadixKey([5, 6]), mamba_value=mamba) == (0, False)
    assert s.cache.root_node.children[5].value.tolist() == [5, 6]


@given(
    segment=st.lists(st.integers(0, 2), max_size=12),
    tokens=st.lists(st.integers(0, 2), max_size=12),
    start=st.integers(0, 12),
)
def test_shared_length_is_the_first_mismatch(segment, tokens, start):
    from impl.radix_key import shared_length

    start = min(start, len(tokens))
    expected = 0
    for a, b in zip(segment, tokens[start:]):
        if a != b:
            break
        expected += 1
    assert shared_length(segment, tokens, start) == expected


def test_radix_key_takes_int_subclasses_and_numpy_like_ints():
    class TokenId(int):
        pass

    assert RadixKey([TokenId(3), 4]).token_ids == [3, 4]
    assert type(RadixKey([TokenId(3)]).token_ids[0]) is int


def test_radix_key_equality_and_hash():
    assert RadixKey([1, 2], "x") == RadixKey([1, 2], "x")
    assert hash(RadixKey([1, 2], "x")) == hash(RadixKey([1, 2], "x"))
    assert RadixKey([1]) != [1]


def test_evicted_property_follows_the_node_out_of_the_tree(s):
    s.insert([1, 2])
    node = s.cache.root_node.children[1]
    assert not node.evicted
    s.cache.evict(2)
    assert node.evicted
    assert "tombstone" not in repr(node)


def test_unfinished_req_with_more_fill_ids_than_its_row_holds_is_refused_before_any_change(s):
    req = Req(0, list(range(100)))
    req.last_node = s.cache.root_node
    (req.req_pool_idx,) = s.pool.alloc(1, [req])
    req.fill_ids = list(range(100))  # the row holds max_context_len = 64 slots
    before = (s.shape(), s.sizes(), s.lru("full"), s.lru("mamba"), s.free_counts())
    with pytest.raises(CacheMisuseError, match=r"request 0 has 100 fill_ids but its row holds 64 KV slots"):
        s.cache.cache_unfinished_req(req, chunked=True)
    assert (s.shape(), s.sizes(), s.lru("full"), s.lru("mamba"), s.free_counts()) == before


# ----- the extra buffer: impl's own pool with track slots ------------------------------------------


class Tracked:
    """A request pool with a ping-pong pair of track slots per request, a paged tree taking
    tracked states, and one request whose forward pass the test plays (its row, its checkpoints)."""

    def __init__(self, device, mamba_size=8, page_size=4, req_size=2):
        self.kv = TokenToKVPoolAllocator(64, device=device, debug=True)
        self.pool = HybridReqToTokenPool(size=req_size, mamba_size=mamba_size, max_context_len=64, device=device, debug=True,
                                         mamba_tracking_slots=2)
        self.mamba = self.pool.mamba_pool
        self.cache = MambaRadixCache(self.pool, self.kv, page_size=page_size, enable_mamba_extra_buffer=True)

    def request(self, tokens):
        req = Req("r", tokens)
        req.req_pool_idx = self.pool.alloc(1, [req])[0]
        req.last_node = self.cache.root_node
        return req

    def compute(self, req, tokens):
        """The forward pass computed `tokens` (the request's fill so far) into fresh KV slots."""
        start = len(req.fill_ids)
        slots = self.kv.alloc(len(tokens) - start)
        self.pool.write((req.req_pool_idx, slice(start, len(tokens))), slots.to(torch.int32))
        req.fill_ids = list(tokens)

    @staticmethod
    def checkpoint(req, length, position):
        """The forward pass wrote the state of `length` tokens into track position `position`."""
        req.mamba_prev_track_seqlen = req.mamba_last_track_seqlen
        req.mamba_last_track_seqlen, req.mamba_last_track_idx = length, position

    def owned(self):
        """Mamba slots free, in the tree, and held by the request (running, track), each once."""
        tree = [int(n.mamba_value[0]) for n in self.cache._iter_nodes() if n.mamba_value is not None]
        return sorted(self.mamba.free_slots.tolist() + tree)


def test_pool_hands_out_track_slots_beside_the_running_state(device):
    t = Tracked(device)
    req = t.request([1, 2, 3, 4])
    assert req.mamba_ping_pong_track_buffer.tolist() == [1, 2] and int(req.mamba_pool_idx) == 0
    assert t.pool.get_mamba_ping_pong_other_idx(0) == 1
    short = Tracked(device, mamba_size=2)
    assert short.pool.alloc(1, [Req("s", [1])]) is None  # three states needed, all or nothing
    with pytest.raises(ValueError, match=r"mamba_tracking_slots must be 0, 1 or 2, got 3"):
        HybridReqToTokenPool(size=1, mamba_size=4, max_context_len=8, device=device, mamba_tracking_slots=3)


def test_running_request_donates_its_latest_checkpoint_and_keeps_tracking(device):
    t = Tracked(device)
    req = t.request(list(range(1, 11)))
    t.compute(req, list(range(1, 11)))
    t.checkpoint(req, 8, 0)
    before = req.mamba_ping_pong_track_buffer.tolist()
    t.cache.cache_unfinished_req(req)
    node = req.last_node
    assert node.key.token_ids == list(range(1, 9)) and int(node.mamba_value[0]) == before[0]
    assert req.mamba_ping_pong_track_buffer.tolist()[1] == before[1] and req.mamba_ping_pong_track_buffer[0] != before[0]
    assert req.mamba_last_track_seqlen is None and len(req.prefix_indices) == 10 and node.full_lock_ref == 1
    # no checkpoint since: nothing goes in, the lock stays
    t.cache.cache_unfinished_req(req)
    assert req.last_node is node and len(t.cache.root_node.children) == 1


def test_finished_request_gives_the_tree_the_checkpoint_its_key_spells(device):
    t = Tracked(device)
    req = t.request(list(range(1, 9)))
    t.compute(req, list(range(1, 13)))
    req.output_ids = list(range(9, 14))  # 12 tokens computed, the last output has no KV yet
    t.checkpoint(req, 8, 0)
    t.checkpoint(req, 16, 1)  # the latest ran past the tokens cached (the overlap loop's next step)
    kept = int(req.mamba_ping_pong_track_buffer[0])
    kv_free = t.kv.available_size()
    t.cache.cache_finished_req(req)
    (node,) = t.cache.root_node.children.values()
    assert node.key.token_ids == list(range(1, 9)) and int(node.mamba_value[0]) == kept
    assert t.kv.available_size() == kv_free + 4  # the KV past the key freed
    assert t.owned() == list(range(8)) and req.mamba_ping_pong_track_buffer is None
    assert t.pool.available_size() == 2 and t.cache.full_protected_size() == 0


def test_finished_request_without_a_checkpoint_caches_nothing(device):
    t = Tracked(device)
    req = t.request([1, 2, 3, 4, 5])
    t.compute(req, [1, 2, 3, 4, 5])
    req.output_ids = [6]
    t.checkpoint(req, 6, 0)  # a checkpoint past the tokens computed, and none before it
    kv_free = t.kv.available_size()
    t.cache.cache_finished_req(req)
    assert t.cache.root_node.children == {} and t.kv.available_size() == kv_free + 5
    assert t.owned() == list(range(8))


def test_donation_into_a_full_mamba_pool_evicts_a_state(device):
    t = Tracked(device, mamba_size=3)
    req = t.request(list(range(1, 9)))
    t.compute(req, list(range(1, 9)))
    t.checkpoint(req, 4, 0)
    with pytest.raises(MambaPoolExhaustedError, match=r"track buffer even after evicting"):
        t.cache.cache_unfinished_req(req)  # every state is the request's own: none can go


def test_a_second_request_s_checkpoint_shares_the_first_s_pages(device):
    t = Tracked(device, mamba_size=12, req_size=3)
    first = t.request(list(range(1, 9)))
    t.compute(first, list(range(1, 9)))
    t.checkpoint(first, 8, 0)
    t.cache.cache_unfinished_req(first)
    second = t.request(list(range(1, 5)) + [0, 0, 0, 0])
    t.compute(second, list(range(1, 5)) + [0, 0, 0, 0])
    t.checkpoint(second, 8, 0)
    own = t.pool.req_to_token[second.req_pool_idx, :4].tolist()
    t.cache.cache_unfinished_req(second)  # splits the first's node after its first page
    assert sorted(tuple(n.key.token_ids) for n in t.cache._iter_nodes()) == [(), (0, 0, 0, 0), (1, 2, 3, 4), (5, 6, 7, 8)]
    shared = t.pool.req_to_token[second.req_pool_idx, :4].tolist()
    assert shared == t.pool.req_to_token[first.req_pool_idx, :4].tolist() != own  # the row rewritten to the tree's
    third = t.request(list(range(1, 9)))
    t.compute(third, list(range(1, 9)))
    t.checkpoint(third, 8, 0)
    donated = int(third.mamba_ping_pong_track_buffer[0])
    t.cache.cache_unfinished_req(third)  # the state is cached already: the donated slot goes back
    assert donated in t.mamba.free_slots.tolist()
