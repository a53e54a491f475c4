"""`Snapshot`: everything the checks need from a cache under test, read straight off its state.

Adapters build snapshots from the implementation's own nodes, lists, counters and pools; the
checks never call the implementation's `sanity_check`.
"""

from __future__ import annotations

from typing import Dict, Hashable, List, NamedTuple, Optional, Tuple

Path = Tuple[Hashable, Tuple[int, ...]]


class NodeView(NamedTuple):
    path: Path
    parent: Optional[Path]  # None for children of the root
    kv: Tuple[int, ...]
    mamba: Optional[int]
    kv_lock: int
    mamba_lock: int
    children: int


class Snapshot(NamedTuple):
    nodes: Dict[Path, NodeView]
    full_lru: List[Path]  # most recent first, as the implementation's list links say
    mamba_lru: List[Path]
    full_links_ok: bool
    mamba_links_ok: bool
    sizes: Tuple[int, int, int, int]  # full evictable, full protected, mamba evictable, mamba protected
    root_locks: Tuple[int, int]
    kv_free: List[int]
    mamba_free: List[int]
    req_free: List[int]
