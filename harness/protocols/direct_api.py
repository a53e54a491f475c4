"""`DirectApi`: the calls a direct user of the cache's API makes, beside any scheduler.

`impl` is a library: besides serving a scheduler, its README shows it called directly. These
operations exercise that API contract (and the misuses it must refuse, leaving the state as it
was). SGLang's caches are only driven by their own schedulers, so only the contract protocol
offers these.

  insert(tokens, extra_key)          fresh KV slots and a fresh state, computed and inserted;
                                     the caller frees what the tree did not take
  match(tokens, extra_key)           a plain match, no copy-on-write
  lock(tokens, extra_key)            match, then lock the node found (a pin)
  unlock(index)                      release pin `index`
  unlock_unlocked(tokens, extra_key) misuse: dec_lock_ref on an unlocked node must be refused
  lock_evicted(index)                misuse: inc_lock_ref on a node that left the tree (but is
                                     still referred to) must be refused
  evict(num_tokens), evict_mamba(num)
  cow_match(tokens, extra_key, own_slot)
                                     a request matched with copy-on-write, then dropped: with
                                     `own_slot` it brings a Mamba slot of its own for the copy,
                                     else the cache allocates one (evicting a state when full,
                                     the matched node protected)
  req_slots(count)                   `count` fresh requests ask the request pool for a slot and a
                                     Mamba slot each: all or nothing; what is granted goes back
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from harness.operations import OperationError
from harness.pairing import PairedCaches, SchedulerOverload
from reference import ROOT

DIRECT_OPERATIONS = (
    "insert", "match", "lock", "unlock", "unlock_unlocked", "lock_evicted", "evict", "evict_mamba", "cow_match", "req_slots",
)


class DirectApi:
    """Direct calls on the cache (a mixin for a protocol that has `caches` and `on_event`)."""

    caches: PairedCaches
    pins: List[Tuple[Any, Any]]  # (node, model path) of each lock taken directly

    def evict(self, num_tokens: int) -> None:
        self.caches.evict(num_tokens)

    def evict_mamba(self, num: int) -> None:
        self.caches.evict_mamba(num)

    def _kv_slots(self, n: int) -> Optional[List[int]]:
        if self.caches.kv_available() < n:
            self.caches.evict(n)
            self.on_event("KV allocation short: evicted, then retried")
        return self.caches.kv_alloc(n)

    def _mamba_slot(self) -> Optional[int]:
        if self.caches.mamba_available() < 1:
            self.caches.evict_mamba(1)
            self.on_event("Mamba allocation short: evicted, then retried")
        got = self.caches.mamba_alloc(1)
        return None if got is None else got[0]

    def insert(self, tokens: Sequence[int], extra_key: Optional[str]) -> None:
        kv = self._kv_slots(len(tokens))
        if kv is None:
            return
        mamba = self._mamba_slot()
        if mamba is None:
            self.caches.free_kv_slots(kv)
            return
        self.caches.compute(extra_key, tokens, kv, mamba)
        prefix_len, exist = self.caches.insert(tokens, extra_key, kv, mamba)
        if not self.caches.model.rules.insert_frees_duplicate_kv:
            self.caches.free_kv_slots(kv[:prefix_len])
        if exist:
            self.caches.free_mamba_slot(mamba)

    def match(self, tokens: Sequence[int], extra_key: Optional[str]) -> None:
        self.caches.match(tokens, extra_key)

    def lock(self, tokens: Sequence[int], extra_key: Optional[str]) -> None:
        node, path = self.caches.match(tokens, extra_key)
        self.caches.lock_node(node, path)
        self.pins.append((node, path))

    def unlock(self, index: int) -> None:
        if index >= len(self.pins):
            raise OperationError("args.index", f"unlock: no pin {index} (pins held: {len(self.pins)})")
        node, path = self.pins.pop(index)
        self.caches.unlock_node(node, path)

    def unlock_unlocked(self, tokens: Sequence[int], extra_key: Optional[str]) -> None:
        call = f"unlock_unlocked({list(tokens)}, extra_key={extra_key!r})"
        node, path = self.caches.match(tokens, extra_key)
        if path == ROOT or self.caches.model.can_dec_lock(path):
            return
        self.caches.refused(call, "dec_lock_ref on an unlocked node", lambda: self.caches.cut.dec_lock_ref(node))

    def evicted_nodes(self) -> List[Any]:
        """Nodes matches returned that have left the tree but are still alive."""
        alive = [ref() for ref in self.caches.recent_nodes]
        return [node for node in alive if node is not None and not self.caches.cut.in_tree(node)]

    def lock_evicted(self, index: int) -> None:
        call = f"lock_evicted(index={index})"
        if not self.caches.cut.refuses_detached_nodes:
            raise OperationError("op", f"{call}: the {self.caches.cut.name} cache does not check for evicted nodes")
        evicted = self.evicted_nodes()
        if index >= len(evicted):
            raise OperationError("args.index", f"{call}: no evicted node {index} (remembered: {len(evicted)})")
        node = evicted[index]
        self.caches.refused(call, "inc_lock_ref on an evicted node", lambda: self.caches.cut.inc_lock_ref(node))
        self.on_event("lock on an evicted node refused")

    def cow_match(self, tokens: Sequence[int], extra_key: Optional[str], own_slot: bool) -> None:
        req = self.caches.new_request(self.next_rid(), tokens, extra_key, 1)
        if own_slot:
            slot = self._mamba_slot()
            if slot is None:
                return
            self.caches.give_mamba_slot(req, slot)
        try:
            self.caches.match_prefix(req, tokens, req=req, cow_mamba=True)
        except SchedulerOverload:
            pass  # every state locked and no slot free: both refused, and nothing changed
        if self.caches.cut.mamba_slot_of(req.cut) is not None:
            self.caches.mamba_free(req)

    def req_slots(self, count: int) -> None:
        reqs = [self.caches.new_request(self.next_rid(), [0], None, 1) for _ in range(count)]
        if self.caches.req_alloc(reqs) is None:
            self.on_event("request slots refused, nothing taken")
            return
        for req in reqs:
            self.caches.req_free(req)
