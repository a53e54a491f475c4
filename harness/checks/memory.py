"""Memory: every pool slot has exactly one owner, and a node that leaves the tree is gone.

`pool_conservation` counts, for each pool, the owners of every slot: the free list, the tree, and
each live request (what the scheduler's requests hold, as the harness tracks them). A slot owned
by nobody is leaked, whatever the model says; a slot owned twice is two requests overwriting each
other. It also compares the free lists' order with the model's (which predicts every hand-out).

`NodeReclamation` keeps a weak reference to every node it has seen in the tree. With Python's
cyclic collector paused (the engines pause it while a program runs), a node that left the tree
must be gone once nothing but the scheduler's own requests refers to it: reference counting alone
must reclaim it: a node kept alive by a reference cycle is memory held until a full collection,
one kept alive by a live object's stale link is held as long as that object lives.
"""

from __future__ import annotations

import gc
import types
import weakref
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

from harness.checks.violation import Tolerate, fail, never, show_path
from harness.snapshot import Snapshot
from reference import ReferenceCache


class RequestHoldings(NamedTuple):
    """What one live request owns and has computed, as the scheduler holds it."""

    rid: int
    kv: Tuple[int, ...]  # KV slots of its row beyond the prefix it shares with the tree
    mamba: Optional[int]
    req_slot: Optional[int]
    extra_key: Optional[str]
    tokens: Tuple[int, ...]  # its input and output so far
    row: Tuple[int, ...]  # its req_to_token row, position by position, as far as it holds KV
    state_len: Optional[int]  # its Mamba state is the digest of tokens[:state_len] (None: no meaning)
    # its track slots (the extra buffer), each with how many tokens the checkpoint the forward
    # pass wrote there is of (None: none written since the request took it)
    tracks: Tuple[Tuple[int, Optional[int]], ...] = ()


def _owners(snap: Snapshot, requests: List[RequestHoldings]) -> Dict[str, Dict[str, List[int]]]:
    """Per pool, who owns which slots: the free list, the tree, each live request."""
    tree_kv, tree_mamba = snap.tree_slots()
    kv = {"the free list": snap.kv_free, "the tree": tree_kv}
    mamba = {"the free list": snap.mamba_free, "the tree": tree_mamba}
    req = {"the free list": snap.req_free}
    for r in requests:
        kv[f"request {r.rid}"] = list(r.kv)
        if r.mamba is not None:
            mamba[f"request {r.rid}"] = [r.mamba]
        if r.tracks:
            mamba[f"request {r.rid}'s track buffer"] = [slot for slot, _ in r.tracks]
        if r.req_slot is not None:
            req[f"request {r.rid}"] = [r.req_slot]
    return {"KV": kv, "Mamba": mamba, "request": req}


def _explain_ownership(pool: str, universe: range, owners: Dict[str, List[int]]) -> None:
    """Fail naming the first slot owned twice, outside the pool, or owned by nobody."""
    seen: Dict[int, str] = {}
    for owner, slots in owners.items():
        for s in slots:
            if s in seen:
                fail("pool_conservation", f"{pool} slot owned twice", f"{pool} slot {s} is owned by both {seen[s]} and {owner}")
            seen[s] = owner
    stray = sorted(set(seen) - set(universe))
    if stray:
        fail("pool_conservation", f"{pool} slot outside the pool", f"{pool} slot(s) {stray} are outside the pool (owners: {[seen[s] for s in stray]})")
    lost = sorted(set(universe) - set(seen))
    fail("pool_conservation", f"{pool} slot leaked", f"{pool} slot(s) {lost} are leaked: not free, not in the tree, not held by a request")


def _by_page(owners: Dict[str, List[int]], page_size: int) -> Dict[str, List[int]]:
    """Each owner's KV slots as the pages they lie on (a request's last page is its own however
    few of its slots it has filled)."""
    return {owner: sorted({s // page_size for s in slots}) for owner, slots in owners.items()}


def pool_conservation(snap: Snapshot, model: ReferenceCache, requests: List[RequestHoldings]) -> None:
    """Every KV, Mamba and request slot (every KV page, when paged) is owned by exactly one of
    free list, tree, a live request; none lost, none twice; slot (page) 0 never used; free lists
    in the model's order."""
    universes = {"KV": model.kv_slots, "Mamba": model.mamba_slots, "request": model.req_slots}
    owned_by = _owners(snap, requests)
    ps = model.page_size
    if ps > 1:
        owned_by["KV page"] = _by_page(owned_by.pop("KV"), ps)
        universes["KV page"] = range(model.kv_slots.start // ps, model.kv_slots.stop // ps)
    for pool, owners in owned_by.items():
        slots = sorted(s for owned in owners.values() for s in owned)
        if slots != list(universes[pool]):  # not every slot owned exactly once
            _explain_ownership(pool, universes[pool], owners)
    for pool, got, want in (
        # paged, which free page comes next is the allocator's to pick: the same pages free
        ("KV", snap.kv_free if ps == 1 else sorted(snap.kv_free), model.kv_free if ps == 1 else sorted(model.kv_free)),
        ("Mamba", snap.mamba_free, model.mamba_free),
        ("request", snap.req_free, model.req_free),
    ):
        if got != want:
            fail("pool_conservation", f"{pool} free list order", f"{pool} free list is {got}, the model says {want}")


class NodeReclamation:
    """Remembers every node seen in the tree (weakly) and checks that the ones gone from it are
    gone from memory."""

    def __init__(self) -> None:
        self._seen: Dict[int, "weakref.ref"] = {}  # id() -> weakref.ref, for every node seen in the tree

    def check(self, snap: Snapshot, held: Iterable[object], root: object, tolerate: Tolerate = never) -> None:
        """Every node seen before and not in `snap` is dead, unless it is one of `held` (a node
        the scheduler's requests refer to, with its ancestors). A known finding may set aside
        removed nodes that only other nodes' links still reach: `tolerate(..., "node links")`
        for nodes taken out of the tree under `root`, `tolerate(..., "a reset tree's links")`
        for nodes of a whole tree a reset dropped (their parents lead to another root)."""
        allowed = {id(node) for node in held}
        for node_id, ref in self._seen.items():
            if node_id in snap.node_refs or node_id in allowed:
                continue
            node = ref()
            if node is None:
                continue
            holders = _holders(node, self._seen)
            what = _kept_by(holders, _root_of(node) is root)
            if tolerate("node_reclaimed", what):
                continue
            fail(
                "node_reclaimed",
                what,
                f"a node that left the tree ({_describe(node)}) is still alive, referred to by "
                f"{sorted(set(holders)) or 'nothing but a reference cycle'}: reference counting does not free it",
            )
        self._seen = {node_id: ref for node_id, ref in snap.node_refs.items()}
        for node in held:
            self._seen.setdefault(id(node), weakref.ref(node))


# what refers to a removed node when only the tree's own links keep it (see `_holders`)
NODE_LINKS = {f"TreeNode.{field}" for field in ("prev", "next", "mamba_prev", "mamba_next", "parent", "children")} | {
    f"UnifiedTreeNode.{field}" for field in ("lru_prev", "lru_next", "parent", "children")
}


def _kept_by(holders: List[str], under_root: bool) -> str:
    """What keeps a removed node alive, as a failure's `what`: "node links" (only other nodes'
    links, for a node taken out of the live tree), "a reset tree's links" (the same, for a node of
    a tree a reset dropped), "a reference cycle" (nothing names it), or the holders' names."""
    if not holders:
        return "a reference cycle"
    if all(h in NODE_LINKS for h in holders):
        return "node links" if under_root else "a reset tree's links"
    return "held by " + ", ".join(sorted(set(holders) - NODE_LINKS))


def _root_of(node: object) -> object:
    """The node its `parent` links lead to in the end (a removed node may still name a parent)."""
    while getattr(node, "parent", None) is not None:
        node = node.parent
    return node


def _holders(node: object, ignore: object) -> List[str]:
    """What refers to `node` (the checker's own frames and records left out), each named as
    `Type.attribute`. Plain loops: a comprehension naming `node` would hold it in a closure cell
    of its own."""
    out: List[str] = []
    for referrer in gc.get_referrers(node):
        if referrer is not ignore and not isinstance(referrer, types.FrameType):
            out.extend(_names(referrer, node))
    return out


def _names(holder: object, value: object) -> List[str]:
    """How `holder` refers to `value`: `Type.attribute` when it is an object's attribute, or
    an object's `__dict__`, or a dict or list an object keeps as an attribute (a node's
    `children`, its per-list LRU links)."""
    if isinstance(holder, list):
        for owner in gc.get_referrers(holder):
            if isinstance(owner, types.FrameType):
                continue
            if isinstance(owner, dict):  # an attribute dict (or a dict the list is a value of)
                names = _names(owner, holder)
            else:  # an object keeping its attributes inline
                names = [f"{type(owner).__name__}.{k}" for k, v in getattr(owner, "__dict__", {}).items() if v is holder]
            if names and names != ["dict"]:
                return names
        return ["list"]
    if not isinstance(holder, dict):
        names = [f"{type(holder).__name__}.{k}" for k, v in getattr(holder, "__dict__", {}).items() if v is value]
        return names or [type(holder).__name__]
    for owner in gc.get_referrers(holder):
        if getattr(owner, "__dict__", None) is holder:
            return [f"{type(owner).__name__}.{k}" for k, v in holder.items() if v is value]
    for owner in gc.get_referrers(holder):
        if isinstance(owner, types.FrameType):
            continue
        names = _names(owner, holder) if isinstance(owner, dict) else [
            f"{type(owner).__name__}.{k}" for k, v in getattr(owner, "__dict__", {}).items() if v is holder
        ]
        if names and names != ["dict"]:
            return names
    return [type(holder).__name__]


def _describe(node: object) -> str:
    key = getattr(node, "key", None)
    tokens = getattr(key, "token_ids", None)
    return f"node {getattr(node, 'id', '?')}" + (f", segment {show_path((None, tuple(tokens)))}" if tokens is not None else "")
