"""The invariants checked after every step, each named for what it promises.

Every check reads a `Snapshot` of the implementation (recomputed from its own nodes, links,
counters and pools) and compares it with the reference model or with itself. None calls the
implementation's `sanity_check`. A failed check raises `InvariantViolation` naming the check.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from harness.snapshot import Path, Snapshot
from reference import STALE, ReferenceCache


class InvariantViolation(AssertionError):
    """An invariant did not hold; `check` names it."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check
        self.message = message


class RequestHoldings(NamedTuple):
    """What one live request owns: KV slots of its row beyond the shared prefix, its slots."""

    rid: int
    kv: Tuple[int, ...]
    mamba: Optional[int]
    req_slot: Optional[int]


def _fail(check: str, message: str) -> None:
    raise InvariantViolation(check, message)


def _path(p: Path) -> str:
    extra, tokens = p
    return f"{list(tokens)}" if extra is None else f"{extra!r}:{list(tokens)}"


def trees_equal(snap: Snapshot, model: ReferenceCache) -> None:
    """Model and implementation hold the same nodes: paths, segment KV, Mamba slot, both locks."""
    impl_nodes = {p: (v.kv, v.mamba, v.kv_lock, v.mamba_lock) for p, v in snap.nodes.items()}
    model_nodes = {p: (r.kv, r.mamba, r.kv_lock, r.mamba_lock) for p, r in model.nodes.items()}
    if impl_nodes == model_nodes:
        return
    lines = []
    for p in sorted(set(impl_nodes) | set(model_nodes), key=lambda q: (str(q[0]), q[1])):
        got, want = impl_nodes.get(p), model_nodes.get(p)
        if got != want:
            lines.append(f"  node {_path(p)}: impl (kv, mamba, kv_lock, mamba_lock)={got}, model={want}")
    _fail("trees_equal", "implementation and model trees differ:\n" + "\n".join(lines))


def lock_rules(snap: Snapshot, model: ReferenceCache) -> None:
    """A KV-locked node's parent is KV-locked; Mamba lock <= KV lock; tombstones have no Mamba
    lock; no count is negative; the root stays locked once for each."""
    if snap.root_locks != (1, 1):
        _fail("lock_rules", f"root lock counts are {snap.root_locks}, expected (1, 1)")
    for p, v in snap.nodes.items():
        if v.kv_lock < 0 or v.mamba_lock < 0:
            _fail("lock_rules", f"node {_path(p)} has negative locks {v.kv_lock}/{v.mamba_lock}")
        if v.mamba_lock > v.kv_lock:
            _fail("lock_rules", f"node {_path(p)} has Mamba lock {v.mamba_lock} > KV lock {v.kv_lock}")
        if v.mamba is None and v.mamba_lock:
            _fail("lock_rules", f"tombstone {_path(p)} has Mamba lock {v.mamba_lock}")
        if v.kv_lock > 0 and v.parent is not None and snap.nodes[v.parent].kv_lock == 0:
            _fail("lock_rules", f"node {_path(p)} is KV-locked but its parent {_path(v.parent)} is not")


def lru_lists(snap: Snapshot, model: ReferenceCache) -> None:
    """The full list holds every node once, the Mamba list every holder once, both in the
    model's recency order, with prev/next links consistent both ways."""
    if not snap.full_links_ok:
        _fail("lru_lists", "full LRU list prev/next links or tick order are inconsistent")
    if not snap.mamba_links_ok:
        _fail("lru_lists", "Mamba LRU list prev/next links or tick order are inconsistent")
    for name, listed, want in (
        ("full", snap.full_lru, model.full_order()),
        ("Mamba", snap.mamba_lru, model.mamba_order()),
    ):
        if listed != want:  # trees_equal ran first, so the model's order names exactly the members
            _explain_lru(name, listed, want, snap)


def _explain_lru(name: str, listed: List[Path], want: List[Path], snap: Snapshot) -> None:
    members = set(snap.nodes) if name == "full" else {p for p, v in snap.nodes.items() if v.mamba is not None}
    twice = [_path(p) for p, n in Counter(listed).items() if n > 1]
    if twice:
        _fail("lru_lists", f"{name} LRU list holds {twice} more than once")
    if set(listed) != members:
        missing = [_path(p) for p in members - set(listed)]
        extra = [_path(p) for p in set(listed) - members]
        _fail("lru_lists", f"{name} LRU list is missing {missing} and wrongly holds {extra}")
    _fail(
        "lru_lists",
        f"{name} LRU order (most recent first) is {[_path(p) for p in listed]}, "
        f"model says {[_path(p) for p in want]}",
    )


def sizes(snap: Snapshot, model: ReferenceCache) -> None:
    """The four counters equal the sums over unlocked / locked nodes, and the model's."""
    nodes = snap.nodes.values()
    recomputed = (
        sum(len(v.kv) for v in nodes if v.kv_lock == 0),
        sum(len(v.kv) for v in nodes if v.kv_lock > 0),
        sum(1 for v in nodes if v.mamba is not None and v.mamba_lock == 0),
        sum(1 for v in nodes if v.mamba is not None and v.mamba_lock > 0),
    )
    names = "(full evictable, full protected, mamba evictable, mamba protected)"
    if snap.sizes != recomputed:
        _fail("sizes", f"counters {names} are {snap.sizes}, the tree sums to {recomputed}")
    if snap.sizes != model.sizes():
        _fail("sizes", f"counters {names} are {snap.sizes}, the model says {model.sizes()}")


def no_tombstone_leaf(snap: Snapshot, model: ReferenceCache) -> None:
    """No leaf is a tombstone: every path ends in a Mamba state that can resume it."""
    for p, v in snap.nodes.items():
        if v.children == 0 and v.mamba is None:
            _fail("no_tombstone_leaf", f"leaf {_path(p)} is a tombstone")


def _owners(snap: Snapshot, requests: List[RequestHoldings]) -> Dict[str, Dict[str, List[int]]]:
    """Per pool, who owns which slots: the free list, the tree, each live request."""
    kv = {"the free list": snap.kv_free, "the tree": [s for v in snap.nodes.values() for s in v.kv]}
    mamba = {"the free list": snap.mamba_free, "the tree": [v.mamba for v in snap.nodes.values() if v.mamba is not None]}
    req = {"the free list": snap.req_free}
    for r in requests:
        kv[f"request {r.rid}"] = list(r.kv)
        if r.mamba is not None:
            mamba[f"request {r.rid}"] = [r.mamba]
        if r.req_slot is not None:
            req[f"request {r.rid}"] = [r.req_slot]
    return {"KV": kv, "Mamba": mamba, "request": req}


def _explain_ownership(pool: str, universe: range, owners: Dict[str, List[int]]) -> None:
    """Fail naming the first slot owned twice, outside the pool, or owned by nobody."""
    seen: Dict[int, str] = {}
    for owner, slots in owners.items():
        for s in slots:
            if s in seen:
                _fail("pool_conservation", f"{pool} slot {s} is owned by both {seen[s]} and {owner}")
            seen[s] = owner
    stray = sorted(set(seen) - set(universe))
    if stray:
        _fail("pool_conservation", f"{pool} slot(s) {stray} are outside the pool (owners: {[seen[s] for s in stray]})")
    lost = sorted(set(universe) - set(seen))
    _fail("pool_conservation", f"{pool} slot(s) {lost} are leaked: not free, not in the tree, not held by a request")


def pool_conservation(snap: Snapshot, model: ReferenceCache, requests: List[RequestHoldings]) -> None:
    """Every KV, Mamba and request slot is owned by exactly one of free list, tree, a live
    request; none lost, none twice; slot 0 never used; free lists in the model's order."""
    nodes = snap.nodes.values()
    owned = {
        "KV": snap.kv_free + [s for v in nodes for s in v.kv] + [s for r in requests for s in r.kv],
        "Mamba": snap.mamba_free
        + [v.mamba for v in nodes if v.mamba is not None]
        + [r.mamba for r in requests if r.mamba is not None],
        "request": snap.req_free + [r.req_slot for r in requests if r.req_slot is not None],
    }
    universes = {"KV": model.kv_slots, "Mamba": model.mamba_slots, "request": model.req_slots}
    for pool, slots in owned.items():
        if sorted(slots) != list(universes[pool]):  # not every slot owned exactly once
            _explain_ownership(pool, universes[pool], _owners(snap, requests)[pool])
    for pool, got, want in (
        ("KV", snap.kv_free, model.kv_free),
        ("Mamba", snap.mamba_free, model.mamba_free),
        ("request", snap.req_free, model.req_free),
    ):
        if got != want:
            _fail("pool_conservation", f"{pool} free list is {got}, the model says {want}")


def data_integrity(
    snap: Snapshot, model: ReferenceCache, kv_payload: List[int], mamba_states: List[Optional[float]]
) -> None:
    """Each tree KV slot holds its own token's data; each Mamba slot holds the state the model
    expects (the fingerprint written, copied or forked into it; zero once freed, or not
    defined once freed where the release leaves freed data stale)."""
    for p, v in snap.nodes.items():
        start = len(p[1]) - len(v.kv)
        for offset, slot in enumerate(v.kv):
            token = p[1][start + offset]
            if kv_payload[slot] != token:
                _fail(
                    "data_integrity",
                    f"node {_path(p)}: KV slot {slot} holds data of token {kv_payload[slot]}, "
                    f"expected token {token} (position {start + offset})",
                )
    for slot, got in enumerate(mamba_states):
        want = model.mamba_state.get(slot, 0.0)
        if want is not STALE and got != want:
            _fail("data_integrity", f"Mamba slot {slot} holds state {got}, expected {want}")


STRUCTURAL_CHECKS: Tuple[Callable[[Snapshot, ReferenceCache], None], ...] = (
    trees_equal,
    lock_rules,
    lru_lists,
    sizes,
    no_tombstone_leaf,
)


def check_all(
    snap: Snapshot,
    model: ReferenceCache,
    requests: List[RequestHoldings],
    kv_payload: List[int],
    mamba_states: List[Optional[float]],
) -> None:
    """Run every invariant; the first that fails raises `InvariantViolation`."""
    for check in STRUCTURAL_CHECKS:
        check(snap, model)
    pool_conservation(snap, model, requests)
    data_integrity(snap, model, kv_payload, mamba_states)


__all__ = [
    "InvariantViolation",
    "RequestHoldings",
    "check_all",
    "data_integrity",
    "lock_rules",
    "lru_lists",
    "no_tombstone_leaf",
    "pool_conservation",
    "sizes",
    "trees_equal",
]
