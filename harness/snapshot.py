"""`Snapshot`: everything the checks need from a cache under test, read straight off its state.

Caches under test build snapshots from their own nodes, lists, counters and pools; the checks
never call the cache's `sanity_check`.
"""

from __future__ import annotations

import weakref
from typing import Dict, Hashable, List, NamedTuple, Optional, Tuple

import torch

Path = Tuple[Hashable, Tuple[int, ...]]


class NodeView(NamedTuple):
    path: Path
    parent: Optional[Path]  # None for children of the root
    kv: Tuple[int, ...]
    mamba: Optional[int]
    kv_lock: int
    mamba_lock: int
    children: int


class TensorView(NamedTuple):
    """One index tensor the tree stores: whose it is, its type and the storage behind it."""

    path: Path
    field: str  # "KV slots" or "Mamba slot"
    dtype: torch.dtype
    device: torch.device
    storage: int  # the address of its storage, to tell tensors that share memory


class Snapshot(NamedTuple):
    """A white-box read of the cache; for a tree whose nodes cannot be read (`opaque` caches)
    `nodes` is None and `tree_kv` / `tree_mamba` list the slots the tree says it holds."""

    nodes: Optional[Dict[Path, NodeView]]
    full_lru: List[Path]  # most recent first, as the cache's list links say
    mamba_lru: List[Path]
    full_links_ok: bool
    mamba_links_ok: bool
    sizes: Tuple[int, int, int, int]  # full evictable, full protected, mamba evictable, mamba protected
    root_locks: Tuple[int, int]
    kv_free: List[int]
    mamba_free: List[int]
    req_free: List[int]
    node_refs: Dict[int, "weakref.ref"]  # a weak reference to every node in the tree, by id()
    tensors: List[TensorView]
    tree_kv: Optional[List[int]] = None
    tree_mamba: Optional[List[int]] = None

    def tree_slots(self) -> Tuple[List[int], List[int]]:
        """The KV slots and the Mamba slots the tree holds."""
        if self.nodes is None:
            return list(self.tree_kv or ()), list(self.tree_mamba or ())
        nodes = self.nodes.values()
        return [s for v in nodes for s in v.kv], [v.mamba for v in nodes if v.mamba is not None]
