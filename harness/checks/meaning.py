"""Meaning of the data: what each KV slot and each Mamba state was computed from.

The harness's forward pass writes into each KV slot the digest of the request's whole token
prefix up to and including that position, and into a request's Mamba state the digest of every
token it has processed (`harness.digest`). These checks hold whatever the model says: a tree
node's KV slots hold the digests of its own path's prefixes and its Mamba state that of exactly
its path; a live request's row and state those of its own tokens.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness import digest
from harness.checks.memory import RequestHoldings
from harness.checks.violation import fail, show_path
from harness.snapshot import Snapshot

Namer = Callable[[Optional[int]], str]


def wrong_slot(slots: Sequence[int], values: Sequence[int], kv_data: List[int]) -> Optional[Tuple[int, int]]:
    """The first (offset, slot) of `slots` whose KV data is not the digest `values` gives for its
    offset, or None when every one holds its own."""
    for offset, (slot, value) in enumerate(zip(slots, values)):
        if kv_data[slot] != value:
            return offset, slot
    return None


def tree_meaning(snap: Snapshot, kv_data: List[int], states: List[Optional[int]], name: Namer) -> None:
    """Each node's KV slots hold its path's prefix digests; each holder's state its path's."""
    known: Dict = {}
    for path in sorted(snap.nodes, key=lambda p: len(p[1])):
        node = snap.nodes[path]
        extra, tokens = path
        start = len(tokens) - len(node.kv)
        # parents come first (shorter paths), so the digest of what precedes the segment is known
        values = digest.digests(extra, tokens[start:], None if node.parent is None else known[node.parent])
        known[path] = values[-1]
        wrong = wrong_slot(node.kv, values, kv_data)
        if wrong is not None:
            offset, slot = wrong
            fail(
                "meaning",
                "node's KV slot",
                f"node {show_path(path)}: KV slot {slot} (position {start + offset}) holds {name(kv_data[slot])}, "
                f"not that of {list(tokens[: start + offset + 1])}",
            )
        if node.mamba is not None and states[node.mamba] != known[path]:
            fail(
                "meaning",
                "node's Mamba state",
                f"node {show_path(path)}: Mamba slot {node.mamba} holds {name(states[node.mamba])}, not that of its "
                f"path {list(tokens)}: a request resuming here would continue from another prefix",
            )


def request_meaning(requests: List[RequestHoldings], kv_data: List[int], states: List[Optional[int]], name: Namer) -> None:
    """Each live request's row holds its own prefix digests, its state that of its processed
    tokens, and each of its track slots the checkpoint last written there."""
    for r in requests:
        wrong = wrong_slot(r.row, digest.digests(r.extra_key, r.tokens[: len(r.row)]), kv_data)
        if wrong is not None:
            position, slot = wrong
            fail(
                "meaning",
                "request's KV slot",
                f"request {r.rid}: its row's KV slot {slot} (position {position}) holds {name(kv_data[slot])}, "
                f"not that of its tokens {list(r.tokens[: position + 1])}",
            )
        if r.mamba is not None and r.state_len:
            want = digest.digest(r.extra_key, r.tokens[: r.state_len])
            if states[r.mamba] != want:
                fail(
                    "meaning",
                    "request's Mamba state",
                    f"request {r.rid}: its Mamba slot {r.mamba} holds {name(states[r.mamba])}, not that of its "
                    f"{r.state_len} processed tokens {list(r.tokens[: r.state_len])}",
                )
        for slot, length in r.tracks:
            if length and states[slot] != digest.digest(r.extra_key, r.tokens[:length]):
                fail(
                    "meaning",
                    "request's track slot",
                    f"request {r.rid}: its track slot {slot} holds {name(states[slot])}, not the checkpoint of its "
                    f"first {length} tokens {list(r.tokens[:length])} the forward pass wrote there",
                )


def tree_slots_meaning(snap: Snapshot, kv_data: List[int], states: List[Optional[int]], computed: Callable[[Optional[int]], bool], name: Namer) -> None:
    """For a tree whose nodes cannot be read: every KV slot and Mamba state it holds holds a
    digest the harness computed (which prefix each stands for is checked where a match hands
    it out)."""
    tree_kv, tree_mamba = snap.tree_slots()
    for slot in tree_kv:
        if not computed(kv_data[slot]):
            fail("meaning", "tree KV slot", f"the tree holds KV slot {slot}, which holds {name(kv_data[slot])}")
    for slot in tree_mamba:
        if not computed(states[slot]):
            fail("meaning", "tree Mamba state", f"the tree holds Mamba slot {slot}, which holds {name(states[slot])}")
