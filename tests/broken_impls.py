"""Deliberately broken variants of `impl.MambaRadixCache`, one planted bug each.

The harness must catch every one (tests/test_harness_bites.py).
"""

from impl import MambaRadixCache
from impl.lru_list import LRUList
from impl.mamba_radix_cache import _is_evictable_leaf


class SplitOffByOne(MambaRadixCache):
    """A split gives the upper part one KV slot too many."""

    def _split_node(self, child, split_len):
        original = child.value
        upper = super()._split_node(child, split_len)
        upper.value = original[: split_len + 1]
        return upper


class MissedEvictableUpdateOnLock(MambaRadixCache):
    """Locking a node leaves its own tokens counted as evictable."""

    def inc_lock_ref(self, node):
        first_lock = node is not self.root_node and node.full_lock_ref == 0
        super().inc_lock_ref(node)
        if first_lock:
            self.full_evictable_size_ += len(node.value)
            self.full_protected_size_ -= len(node.value)


class TombstoneLeafLeftBehind(MambaRadixCache):
    """Evicting a leaf stops the cascade at a tombstone parent, leaving it as a leaf."""

    def _evict_leaf(self, leaf, kv_freed, mamba_freed):
        parent = leaf.parent
        shields = parent is not self.root_node and parent.mamba_value is None
        if shields:
            parent.full_lock_ref += 1
        try:
            return super()._evict_leaf(leaf, kv_freed, mamba_freed)
        finally:
            if shields:
                parent.full_lock_ref -= 1


class _ParentFirstLRUList(LRUList):
    def reset_path_mru(self, path):
        super().reset_path_mru(tuple(reversed(path)))


class WrongLRURefreshOrder(MambaRadixCache):
    """A match refreshes the parents ahead of the matched node."""

    def reset(self):
        super().reset()
        self.full_lru_list = _ParentFirstLRUList("full_link", "full", _is_evictable_leaf)


class KVSlotFreedTwice(MambaRadixCache):
    """Finishing a request also frees the last KV slot of the prefix it shares with the tree."""

    def cache_finished_req(self, req, is_insert=True):
        if len(req.prefix_indices):
            self.token_to_kv_pool_allocator.free(req.prefix_indices[-1:])
        super().cache_finished_req(req, is_insert)


BROKEN = {
    cls.__name__: cls
    for cls in (
        SplitOffByOne,
        MissedEvictableUpdateOnLock,
        TombstoneLeafLeftBehind,
        WrongLRURefreshOrder,
        KVSlotFreedTwice,
    )
}
