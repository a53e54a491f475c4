"""Ownership and types of what the tree stores.

Every index the tree stores (KV slots and Mamba slots) is int64 on the pool's device, and its
memory is the tree's own: no tree tensor shares storage with a pool's free list (which the pool
rewrites) or with the request-to-token rows (which the next request in that slot overwrites).
The harness also overwrites what it hands the cache once the caller is done with it (a direct
`insert`'s values and Mamba index once the call returns, a request row once its slot goes to the
next request), so a tree that kept the caller's tensor changes and fails the structure checks
(the driver's `handed_tensors` switch, `harness.pairing.PairedCaches._overwrite`).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from harness.checks.violation import Tolerate, fail, never, show_path
from harness.snapshot import Snapshot

# the request pool's index tensors and SGLang's dtypes for them
POOL_INDEX_DTYPES = {"req_to_token": torch.int32, "req_index_to_mamba_index_mapping": torch.int32}


def pool_index_types(req_pool: Any) -> None:
    """The request pool's index tensors have SGLang's dtypes."""
    for name, dtype in POOL_INDEX_DTYPES.items():
        got = getattr(req_pool, name).dtype
        if got != dtype:
            fail("index_types", f"{name} of dtype {got}", f"{name} holds {got}, not {dtype} (SGLang's dtype)")


def index_types(snap: Snapshot, device: torch.device, tolerate: Tolerate = never) -> None:
    """Every tree tensor is int64 on the pools' device."""
    for view in snap.tensors:
        if view.dtype == torch.int64 and view.device == device:
            continue
        what = f"{view.field} of dtype {view.dtype}" if view.dtype != torch.int64 else f"{view.field} on another device"
        if not tolerate("index_types", what):
            fail(
                "index_types",
                what,
                f"node {show_path(view.path)}: the tensor of its {view.field} is {view.dtype} on {view.device}, "
                f"not torch.int64 on {device}",
            )


def own_storage(snap: Snapshot, free_lists: Iterable[int], rows: int, tolerate: Tolerate = never) -> None:
    """No tree tensor shares storage with a pool's free list or the request rows."""
    foreign = {storage: "a pool's free list" for storage in free_lists}
    foreign[rows] = "the request-to-token rows"
    for view in snap.tensors:
        owner = foreign.get(view.storage)
        what = f"{view.field} viewing {owner}"
        if owner is not None and not tolerate("own_storage", what):
            fail(
                "own_storage",
                what,
                f"node {show_path(view.path)}: the tensor of its {view.field} is a view of {owner}, memory the tree "
                f"does not own (it keeps that whole tensor alive, and whoever owns it may rewrite it)",
            )
