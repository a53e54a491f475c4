"""Structure against the model: the tree, its locks, its two LRU lists and its size counters are
what the reference model says they are. Each check reads a `Snapshot` (recomputed from the
cache's own nodes, links and counters) and compares it with the model or with itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, List, Tuple

from harness.checks.violation import fail, show_path
from harness.snapshot import Path, Snapshot
from reference import ReferenceCache


def trees_equal(snap: Snapshot, model: ReferenceCache) -> None:
    """Model and cache hold the same nodes: paths, segment KV, Mamba slot, both locks."""
    cut_nodes = {p: (v.kv, v.mamba, v.kv_lock, v.mamba_lock) for p, v in snap.nodes.items()}
    model_nodes = {p: (r.kv, r.mamba, r.kv_lock, r.mamba_lock) for p, r in model.nodes.items()}
    if cut_nodes == model_nodes:
        return
    lines, kinds = [], []
    for p in sorted(set(cut_nodes) | set(model_nodes), key=lambda q: (str(q[0]), q[1])):
        got, want = cut_nodes.get(p), model_nodes.get(p)
        if got != want:
            lines.append(f"  node {show_path(p)}: cache (kv, mamba, kv_lock, mamba_lock)={got}, model={want}")
            kinds.append(_difference(got, want))
    fail("trees_equal", kinds[0], "the cache's tree and the model's differ:\n" + "\n".join(lines))


def _difference(got, want) -> str:
    """What differs first about one node, in words without its numbers."""
    if got is None:
        return "node missing from the cache"
    if want is None:
        return "node the model lacks"
    fields = ("KV slots", "Mamba slot", "KV lock", "Mamba lock")
    return "node's " + next(name for name, a, b in zip(fields, got, want) if a != b)


def lock_rules(snap: Snapshot, model: ReferenceCache) -> None:
    """A KV-locked node's parent is KV-locked; Mamba lock <= KV lock; tombstones have no Mamba
    lock; no count is negative; the root stays locked once for each."""
    if snap.root_locks != (1, 1):
        fail("lock_rules", "root lock counts", f"root lock counts are {snap.root_locks}, expected (1, 1)")
    for p, v in snap.nodes.items():
        if v.kv_lock < 0 or v.mamba_lock < 0:
            fail("lock_rules", "negative lock count", f"node {show_path(p)} has negative locks {v.kv_lock}/{v.mamba_lock}")
        if v.mamba_lock > v.kv_lock:
            fail("lock_rules", "Mamba lock above KV lock", f"node {show_path(p)} has Mamba lock {v.mamba_lock} > KV lock {v.kv_lock}")
        if v.mamba is None and v.mamba_lock:
            fail("lock_rules", "Mamba-locked tombstone", f"tombstone {show_path(p)} has Mamba lock {v.mamba_lock}")
        if v.kv_lock > 0 and v.parent is not None and snap.nodes[v.parent].kv_lock == 0:
            fail("lock_rules", "KV-locked node under an unlocked parent", f"node {show_path(p)} is KV-locked but its parent {show_path(v.parent)} is not")


def lru_lists(snap: Snapshot, model: ReferenceCache) -> None:
    """The full list holds every node once, the Mamba list every holder once, both in the
    model's recency order, with prev/next links consistent both ways."""
    if not snap.full_links_ok:
        fail("lru_lists", "full LRU links", "full LRU list prev/next links or tick order are inconsistent")
    if not snap.mamba_links_ok:
        fail("lru_lists", "Mamba LRU links", "Mamba LRU list prev/next links or tick order are inconsistent")
    for name, listed, want in (
        ("full", snap.full_lru, model.full_order()),
        ("Mamba", snap.mamba_lru, model.mamba_order()),
    ):
        if listed != want:  # trees_equal ran first, so the model's order names exactly the members
            _explain_lru(name, listed, want, snap)


def _explain_lru(name: str, listed: List[Path], want: List[Path], snap: Snapshot) -> None:
    members = set(snap.nodes) if name == "full" else {p for p, v in snap.nodes.items() if v.mamba is not None}
    twice = [show_path(p) for p, n in Counter(listed).items() if n > 1]
    if twice:
        fail("lru_lists", f"{name} LRU member listed twice", f"{name} LRU list holds {twice} more than once")
    if set(listed) != members:
        missing = [show_path(p) for p in members - set(listed)]
        extra = [show_path(p) for p in set(listed) - members]
        fail("lru_lists", f"{name} LRU members", f"{name} LRU list is missing {missing} and wrongly holds {extra}")
    fail(
        "lru_lists",
        f"{name} LRU order",
        f"{name} LRU order (most recent first) is {[show_path(p) for p in listed]}, "
        f"model says {[show_path(p) for p in want]}",
    )


def sizes(snap: Snapshot, model: ReferenceCache) -> None:
    """The four counters equal the sums over unlocked / locked nodes (for a tree whose nodes
    cannot be read: evictable and protected together count the slots it holds), and the model's."""
    names = "(full evictable, full protected, mamba evictable, mamba protected)"
    if snap.nodes is None:
        tree_kv, tree_mamba = snap.tree_slots()
        held = (snap.sizes[0] + snap.sizes[1], snap.sizes[2] + snap.sizes[3])
        if held != (len(tree_kv), len(tree_mamba)):
            fail("sizes", "counters against the slots the tree holds", f"counters {names} are {snap.sizes}, but the tree holds {len(tree_kv)} KV and {len(tree_mamba)} Mamba slots")
    else:
        nodes = snap.nodes.values()
        recomputed = (
            sum(len(v.kv) for v in nodes if v.kv_lock == 0),
            sum(len(v.kv) for v in nodes if v.kv_lock > 0),
            sum(1 for v in nodes if v.mamba is not None and v.mamba_lock == 0),
            sum(1 for v in nodes if v.mamba is not None and v.mamba_lock > 0),
        )
        if snap.sizes != recomputed:
            fail("sizes", "counters against the tree", f"counters {names} are {snap.sizes}, the tree sums to {recomputed}")
    if snap.sizes != model.sizes():
        fail("sizes", "counters against the model", f"counters {names} are {snap.sizes}, the model says {model.sizes()}")


def no_tombstone_leaf(snap: Snapshot, model: ReferenceCache) -> None:
    """No leaf is a tombstone: every path ends in a Mamba state that can resume it (unless the
    release lets a node's KV alone keep it in the tree: `Rules.kv_decides_node_survival`)."""
    if model.rules.kv_decides_node_survival:
        return
    for p, v in snap.nodes.items():
        if v.children == 0 and v.mamba is None:
            fail("no_tombstone_leaf", "tombstone leaf", f"leaf {show_path(p)} is a tombstone")


STRUCTURAL_CHECKS: Tuple[Callable[[Snapshot, ReferenceCache], None], ...] = (
    trees_equal,
    lock_rules,
    lru_lists,
    sizes,
    no_tombstone_leaf,
)
# what can be checked of a tree whose nodes cannot be read (`Snapshot.nodes` is None)
OUTSIDE_CHECKS: Tuple[Callable[[Snapshot, ReferenceCache], None], ...] = (sizes,)
