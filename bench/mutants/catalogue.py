"""The seeded-bug catalogue: realistic single-point bugs in `impl/`, one `Mutant` each.

Each is the kind of slip a person changing the cache makes: an off-by-one, a forgotten refresh,
a counter updated on one path only, the wrong field tested, a slot freed on the wrong branch.
`python -m bench.mutants` runs the harness against every one and prints whether it was caught.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from bench.mutants.patch import Mutant
from strategies.config import Serving, serving

CACHE = "impl.mamba_radix_cache:MambaRadixCache"


def _m(name: str, area: str, target: str, why: str, *edits: Tuple[str, str], serving: Optional[Serving] = None) -> Mutant:
    return Mutant(name=name, area=area, target=target, edits=tuple(edits), why=why, serving=serving)


# SGLang's default serving path, paged: the extra buffer under the overlap loop, pages of 4
PAGED_EXTRA_BUFFER = serving("extra_buffer", "overlap", 4)


MUTANTS: Tuple[Mutant, ...] = (
    # ----- lock accounting --------------------------------------------------------------------
    _m("inc-lock-node-only", "lock accounting", f"{CACHE}.inc_lock_ref",
       "locking a node does not lock its ancestors",
       ("            node = node.parent\n        return None", "            break\n        return None")),
    _m("dec-lock-keeps-mamba-lock", "lock accounting", f"{CACHE}.dec_lock_ref",
       "unlocking never releases the node's Mamba lock",
       ("node.mamba_lock_ref -= 1", "node.mamba_lock_ref -= 0")),
    _m("finished-keeps-lock", "lock accounting", f"{CACHE}.cache_finished_req",
       "a finished request's lock on its last node is never released",
       ("free_mamba_cache=mamba_exist)\n        self.dec_lock_ref(req.last_node)\n", "free_mamba_cache=mamba_exist)\n")),
    _m("split-drops-lock", "lock accounting", f"{CACHE}._split_node",
       "the upper half of a split starts unlocked although the lower half is locked",
       ("upper.full_lock_ref = child.full_lock_ref", "upper.full_lock_ref = 0")),
    _m("unfinished-lock-not-moved", "lock accounting", f"{CACHE}.cache_unfinished_req",
       "a chunk's insert locks the new last node without unlocking the old one",
       ("        self.dec_lock_ref(req.last_node)\n", "")),
    _m("leaf-evictable-ignores-lock", "lock accounting", "impl.mamba_radix_cache:_is_evictable_leaf",
       "the full list's eviction rule forgets the lock check",
       ("return not node.children and node.full_lock_ref == 0", "return not node.children")),
    # ----- LRU refresh order ------------------------------------------------------------------
    _m("match-refreshes-parents-first", "LRU refresh order", "impl.lru_list:LRUList.reset_path_mru",
       "a match leaves the parents more recent than the matched node",
       ("for node in reversed(path):", "for node in path:")),
    _m("insert-skips-refresh", "LRU refresh order", f"{CACHE}._insert_helper",
       "insert does not refresh the nodes on its path",
       ("        self._refresh_path(walked)\n", "")),
    _m("match-skips-mamba-refresh", "LRU refresh order", f"{CACHE}._match_prefix_helper",
       "a match refreshes the full list but not the Mamba list",
       ("        self._refresh_path(self._path_from(best_node))\n",
        "        self.full_lru_list.reset_path_mru(self._path_from(best_node))\n")),
    _m("split-lower-not-refreshed", "LRU refresh order", f"{CACHE}._split_node",
       "after a split the lower half stays behind the new upper half in the full list",
       ("        self.full_lru_list.reset_mru(child)\n", "")),
    _m("insert-refreshes-top-down", "LRU refresh order", f"{CACHE}._insert_helper",
       "insert leaves the root's child most recent instead of the deepest node it walked",
       ("        walked.reverse()\n", "")),
    _m("unfinished-split-not-refreshed", "LRU refresh order", f"{CACHE}.cache_unfinished_req",
       "after a chunk whose insert split a node, the split's lower half stays ahead of the path",
       ("        if split:\n            self._refresh_path(self._path_from(new_last_node))\n", "")),
    _m("refresh-skips-mamba-list", "LRU refresh order", f"{CACHE}._refresh_path",
       "match and insert refresh their path in the full list only",
       ("        self.mamba_lru_list.reset_path_mru([n for n in path if n.mamba_value is not None])\n", "")),
    # ----- node split -------------------------------------------------------------------------
    _m("split-lower-keeps-one-slot", "node split", f"{CACHE}._split_node",
       "the lower half keeps the last KV slot of the upper half too",
       ("child.value = child.value[split_len:]", "child.value = child.value[split_len - 1 :]")),
    _m("split-child-under-old-key", "node split", f"{CACHE}._split_node",
       "the lower half hangs off the upper half under its old first token",
       ("upper.children[child_key(lower_key, self.page_size)] = child", "upper.children[child_key(child.key, self.page_size)] = child")),
    _m("match-no-split-at-key-end", "node split", f"{CACHE}._match_prefix_helper",
       "a key ending inside a node takes the whole node instead of splitting it",
       ("if prefix_len < len(child.key):", "if prefix_len < end - pos:")),
    # ----- tombstones and cascade deletion ----------------------------------------------------
    _m("cascade-deletes-holders", "tombstone cascade", f"{CACHE}._evict_leaf",
       "the cascade deletes childless ancestors that still hold a Mamba state",
       ("            and parent.mamba_value is None\n", "")),
    _m("cascade-stops-at-first", "tombstone cascade", f"{CACHE}._evict_leaf",
       "the cascade deletes one tombstone ancestor at most",
       ("            parent = grandparent\n", "            parent = grandparent\n            break\n")),
    _m("match-answers-tombstone", "tombstone cascade", f"{CACHE}._match_prefix_helper",
       "a match may end at a tombstone, answering KV without a Mamba state",
       ("        if node.mamba_value is not None:\n            best_value_len, best_node = len(value), node\n\n",
        "        best_value_len, best_node = len(value), node\n\n")),
    # ----- evict loops ------------------------------------------------------------------------
    _m("evict-one-short", "evict loop", f"{CACHE}.evict",
       "evict stops one token short of what was asked",
       ("while evicted < full_num_tokens:", "while evicted < full_num_tokens - 1:")),
    _m("evict-counts-leaves", "evict loop", f"{CACHE}.evict",
       "evict counts leaves instead of tokens, evicting far more than asked",
       ("evicted += self._evict_leaf(leaf, kv_freed, mamba_freed)",
        "self._evict_leaf(leaf, kv_freed, mamba_freed)\n            evicted += 1")),
    _m("evicted-parent-not-offered", "evict loop", f"{CACHE}._evict_leaf",
       "a parent left childless by an eviction is never offered as a candidate",
       ("            self.full_lru_list.note_maybe_evictable(parent)\n", "            pass\n")),
    _m("unlock-not-offered", "evict loop", f"{CACHE}.dec_lock_ref",
       "a leaf unlocked to zero is never offered for eviction",
       ("                self.full_lru_list.note_maybe_evictable(node)\n", "                pass\n")),
    _m("stale-entry-taken-as-current", "evict loop", "impl.eviction_queue:EvictionQueue.settle_front",
       "the queue's front is taken as current although its node was refreshed since its offer",
       ("            if now == tick:\n", "            if now is not None:\n")),
    # ----- evict_mamba on internal nodes ------------------------------------------------------
    _m("evict-mamba-internal-stays-listed", "evict_mamba internal", f"{CACHE}.evict_mamba",
       "an internal node tombstoned by evict_mamba stays in the Mamba list",
       ("                self.mamba_lru_list.remove(node)\n", "")),
    _m("evict-mamba-internal-leaks-slot", "evict_mamba internal", f"{CACHE}.evict_mamba",
       "an internal node's Mamba slot is dropped without being freed",
       ("                mamba_freed.append(node.mamba_value)\n", "")),
    _m("evict-mamba-leaf-tombstoned", "evict_mamba internal", f"{CACHE}.evict_mamba",
       "evict_mamba tombstones leaves too, leaving tombstone leaves",
       ("if node.children:", "if node.children is not None:")),
    _m("evict-mamba-once", "evict_mamba internal", f"{CACHE}.evict_mamba",
       "evict_mamba evicts one state however many were asked",
       ("while evicted < mamba_num:", "while evicted < min(mamba_num, 1):")),
    # ----- cow_mamba slot handling ------------------------------------------------------------
    _m("cow-tests-wrong-field", "cow_mamba", f"{CACHE}._copy_mamba_to_req",
       "cow tests the request slot instead of the Mamba slot, so it always allocates",
       ("if req.mamba_pool_idx is not None:", "if req.req_pool_idx is not None:")),
    _m("cow-unprotected-evict", "cow_mamba", f"{CACHE}._copy_mamba_to_req",
       "cow evicts to make room without protecting the node it copies from",
       ("            node.mamba_lock_ref += 1\n", ""), ("                node.mamba_lock_ref -= 1\n", "")),
    _m("cow-copies-backwards", "cow_mamba", f"{CACHE}._copy_mamba_to_req",
       "cow into a new slot copies the fresh slot over the tree's state",
       ("        mamba_pool.copy_from(node.mamba_value, dst)\n", "        mamba_pool.copy_from(dst, node.mamba_value)\n")),
    # ----- chunked prefill and finishing ------------------------------------------------------
    _m("unfinished-shares-live-state", "chunked prefill", f"{CACHE}.cache_unfinished_req",
       "a chunk inserts the request's running Mamba slot instead of a fork of it",
       ("self._insert_helper(key, value, forked.clone())", "self._insert_helper(key, value, req_mamba)")),
    _m("unfinished-prefix-stale", "chunked prefill", f"{CACHE}.cache_unfinished_req",
       "after a chunk the request's prefix_indices are not updated",
       ("        req.prefix_indices = new_indices\n", "")),
    _m("unfinished-row-not-rewritten", "chunked prefill", f"{CACHE}.cache_unfinished_req",
       "after a chunk the request row keeps its own, now freed, duplicate KV slots",
       ("self.req_to_token_pool.write(", "(lambda *_: None)(")),
    _m("unfinished-prefix-from-stale-row", "chunked prefill", f"{CACHE}.cache_unfinished_req",
       "a chunk's new prefix is copied from the row even when another request cached the chunk "
       "meanwhile, so the prefix and the row keep the request's freed duplicate slots",
       ("        if new_prefix_len == prefix_len:\n", "        if new_prefix_len >= prefix_len:\n")),
    _m("unfinished-frees-new-fork", "chunked prefill", f"{CACHE}.cache_unfinished_req",
       "the fork is freed when the tree took it, kept when it did not",
       ("        if mamba_exist:\n", "        if not mamba_exist:\n")),
    _m("finished-frees-shared-prefix", "chunked prefill", f"{CACHE}.cache_finished_req",
       "a finished request frees the KV slots it shares with the tree",
       ("kv_indices[len(req.prefix_indices) : new_prefix_len]", "kv_indices[:new_prefix_len]")),
    _m("finished-always-frees-mamba", "chunked prefill", f"{CACHE}.cache_finished_req",
       "a finished request's Mamba slot is freed even when the tree took it",
       ("free_mamba_cache=mamba_exist", "free_mamba_cache=True")),
    # ----- size counters ----------------------------------------------------------------------
    _m("new-leaf-not-counted", "size counters", f"{CACHE}._insert_helper",
       "a new leaf's KV tokens are not added to the evictable size",
       ("            self.full_evictable_size_ += leaf.value.numel()\n", "")),
    _m("revived-tombstone-not-counted", "size counters", f"{CACHE}._insert_helper",
       "a tombstone given a state again is not counted as a Mamba holder",
       ("            node.mamba_value = mamba_value\n            self.mamba_evictable_size_ += mamba_value.numel()\n",
        "            node.mamba_value = mamba_value\n")),
    _m("unlock-threshold-off-by-one", "size counters", f"{CACHE}.dec_lock_ref",
       "unlock moves KV tokens back to evictable one unlock too late",
       ("            if node.full_lock_ref == 1:\n", "            if node.full_lock_ref == 0:\n")),
    _m("lock-mamba-protected-sign", "size counters", f"{CACHE}.inc_lock_ref",
       "locking a state subtracts it from the protected size instead of adding it",
       ("self.mamba_protected_size_ += node.mamba_value.numel()", "self.mamba_protected_size_ -= node.mamba_value.numel()")),
    _m("deleted-node-still-counted", "size counters", f"{CACHE}._delete_node",
       "an evicted node's KV tokens stay in the evictable size",
       ("        self.full_evictable_size_ -= node.value.numel()\n", "")),
    # ----- pools ------------------------------------------------------------------------------
    _m("alloc-refuses-exact-fit", "pools", "impl.free_list:FreeList.take",
       "a pool refuses a request for exactly the slots it has free",
       ("if n > self._head_len + self._tail_len:", "if n >= self._head_len + self._tail_len:")),
    _m("take-skips-join", "pools", "impl.free_list:FreeList.take",
       "a take longer than the free list's head hands out the head only, not the freed slots queued behind it",
       ("        if n > self._head_len:\n            self._join()\n", "")),
    _m("join-keeps-count", "pools", "impl.free_list:FreeList._join",
       "joining the freed slots onto the head leaves their count behind, so a pool reports slots it does not have",
       ("            self._tail_len = 0\n", "")),
    _m("mamba-fork-no-copy", "pools", "impl.mamba_pool:MambaPool.fork_from",
       "a fork allocates a slot but does not copy the state into it",
       ("        self.copy_from(src_index, dst)\n", "")),
    _m("req-free-ignores-flag", "pools", "impl.req_to_token_pool:HybridReqToTokenPool.free",
       "freeing a request slot frees its Mamba slot even when told not to",
       ("if free_mamba_cache and indices:", "if indices:")),
    _m("req-alloc-leaks-on-failure", "pools", "impl.req_to_token_pool:HybridReqToTokenPool.alloc",
       "request slots are taken before the Mamba pool is asked, and kept when it says no",
       ("            req.mamba_last_track_idx = 0\n        select = self.free_slots[:need_size]\n"
        "        self.free_slots = self.free_slots[need_size:]\n",
        "            req.mamba_last_track_idx = 0\n"),
       ("        without_mamba = [req for req in reqs if req.mamba_pool_idx is None]\n",
        "        select = self.free_slots[:need_size]\n        self.free_slots = self.free_slots[need_size:]\n"
        "        without_mamba = [req for req in reqs if req.mamba_pool_idx is None]\n")),
    _m("kv-free-adopts-callers-tensor", "pools", "impl.kv_allocator:TokenToKVPoolAllocator.free",
       "a KV free keeps the caller's index tensor as its own free list, so the caller's next use of "
       "it rewrites the pool",
       ("owned = free_index.data_ptr() != given.data_ptr()", "owned = free_index.data_ptr() == given.data_ptr()")),
    _m("mamba-free-adopts-callers-tensor", "pools", "impl.mamba_pool:MambaPool.free",
       "a Mamba free keeps the caller's index tensor as its own free list",
       ("owned = not isinstance(free_index, torch.Tensor) or", "owned = isinstance(free_index, torch.Tensor) or")),
    _m("mamba-map-not-int32", "pools", "impl.req_to_token_pool:HybridReqToTokenPool.__init__",
       "the request-to-Mamba map is allocated without its int32 dtype (float32 rounds slot ids past 2**24)",
       ("            size, dtype=torch.int32, device=self.device\n        )\n        self._ledger",
        "            size, device=self.device\n        )\n        self._ledger")),
    _m("req-mapping-not-written", "pools", "impl.req_to_token_pool:HybridReqToTokenPool.alloc",
       "a request slot's Mamba index is not recorded, so it reads another request's state",
       ("            self.req_index_to_mamba_index_mapping[select[0]] = reqs[0].mamba_pool_idx\n", "            pass\n")),
    # ----- what the data means, memory, ownership: each caught by one check alone -------------
    _m("fork-of-the-cached-prefix", "meaning", f"{CACHE}.cache_unfinished_req",
       "a chunk's node gets a fork of the state cached at the request's old prefix, not of the request's "
       "own state: the state sits on a longer prefix than the one it was computed for",
       ("req_mamba = self._req_mamba_slot(req)\n        forked = mamba_pool.fork_from(req_mamba)",
        "req_mamba = self._req_mamba_slot(req)\n        forked = mamba_pool.fork_from("
        "req_mamba if req.last_node.mamba_value is None else req.last_node.mamba_value)")),
    _m("reset-keeps-tree-linked", "memory", f"{CACHE}._dismantle",
       "reset marks the old tree's nodes as gone but leaves them linked (parents and children, list "
       "neighbours referring to each other): they are freed only by a full collection",
       ("        for lru in (self.full_lru_list, self.mamba_lru_list):\n            lru.clear()\n", ""),
       ("            node.children = {}\n", "")),
    _m("finished-mamba-slot-int32", "ownership", f"{CACHE}.cache_finished_req",
       "a finished request's Mamba slot goes into the tree as the int32 the request-to-Mamba map holds",
       ("mamba_value = self._req_mamba_slot(req).to(torch.int64, copy=True)",
        "mamba_value = self._req_mamba_slot(req).clone()")),
    _m("insert-keeps-callers-tensors", "ownership", f"{CACHE}.insert",
       "insert keeps the caller's KV and Mamba index tensors as the node's own, so the caller's next use of "
       "them rewrites the tree",
       ("        value = value.to(device=self.device, dtype=torch.int64, copy=True)\n"
        "        mamba_value = mamba_value.to(device=self.device, dtype=torch.int64, copy=True)\n",
        "        value = value.to(device=self.device, dtype=torch.int64)\n"
        "        mamba_value = mamba_value.to(device=self.device, dtype=torch.int64)\n")),
    _m("fork-views-free-list", "ownership", f"{CACHE}.cache_unfinished_req",
       "a chunk's node keeps the fork as the pool handed it out, a view of the pool's free list",
       ("self._insert_helper(key, value, forked.clone())", "self._insert_helper(key, value, forked)")),
    # ----- the extra buffer and pages (hunted inside SGLang's own scheduler) ------------------
    _m("page-child-by-first-token", "extra buffer and pages", "impl.radix_key:child_key_at",
       "paged, a node's children are told apart by their first token, not their first page: a child whose "
       "first page differs from another's after its first token replaces it",
       ("first = tokens[pos] if page_size == 1 else tuple(tokens[pos : pos + page_size])", "first = tokens[pos]"),
       serving=PAGED_EXTRA_BUFFER),
    _m("finished-takes-the-other-track-slot", "extra buffer and pages", f"{CACHE}._cache_finished_tracked",
       "a finished request gives the tree the other slot of its ping-pong pair, not the one holding the "
       "checkpoint it keys",
       ("state = req.mamba_ping_pong_track_buffer[position]",
        "state = req.mamba_ping_pong_track_buffer[self.req_to_token_pool.get_mamba_ping_pong_other_idx(position)]"),
       serving=PAGED_EXTRA_BUFFER),
    _m("donation-keeps-track-slot", "extra buffer and pages", f"{CACHE}._cache_unfinished_tracked",
       "a running request's tracked state goes into the tree while the request keeps the slot in its pair "
       "(the fresh slot is never put in): the tree's state is overwritten at the next boundary",
       ("donated = pool.donate_mamba_ping_pong_slot(req, fresh).reshape(1)",
        "mamba_pool.free(fresh)\n        donated = req.mamba_ping_pong_track_buffer[picked[1]].reshape(1)"),
       serving=PAGED_EXTRA_BUFFER),
    _m("finished-frees-donated-state", "extra buffer and pages", f"{CACHE}._cache_finished_tracked",
       "a finished request frees every track slot, the one the tree just took too",
       ("            keep = None if exist else position\n", ""), serving=PAGED_EXTRA_BUFFER),
)

BY_NAME: Dict[str, Mutant] = {m.name: m for m in MUTANTS}
if len(BY_NAME) != len(MUTANTS):
    raise AssertionError("mutant names must be unique")
