"""`TreeNode`: one segment of the radix tree (tokens, their KV slots, an optional Mamba slot)."""

from __future__ import annotations

from typing import Dict, Hashable, Optional

import torch

from impl.lru_list import Link
from impl.radix_key import RadixKey


class TreeNode:
    """A node of the hybrid radix tree.

    `value` holds one KV slot per token of `key`; `mamba_value` (shape [1]) the Mamba state after
    the node's last token, or None for a tombstone. `full_lock_ref` counts locks on the node or its
    descendants; `mamba_lock_ref` counts locks on the node itself while it holds a Mamba state.
    `id` is unique within one cache (numbered per cache, so runs are reproducible).
    """

    __slots__ = (
        "id",
        "parent",
        "children",
        "key",
        "value",
        "mamba_value",
        "full_lock_ref",
        "mamba_lock_ref",
        "full_link",
        "mamba_link",
        "in_tree",
        "__weakref__",
    )

    def __init__(self, node_id: int, key: RadixKey, value: torch.Tensor, parent: Optional["TreeNode"] = None):
        self.id = node_id
        self.parent = parent
        self.children: Dict[Hashable, TreeNode] = {}
        self.key = key
        self.value = value
        self.mamba_value: Optional[torch.Tensor] = None
        self.full_lock_ref = 0
        self.mamba_lock_ref = 0
        self.full_link = Link(self)
        self.mamba_link = Link(self)
        self.in_tree = True

    @property
    def evicted(self) -> bool:
        return not self.in_tree

    def __repr__(self) -> str:
        state = "tombstone" if self.mamba_value is None else f"mamba={int(self.mamba_value[0])}"
        return (
            f"TreeNode(id={self.id}, tokens={len(self.key)}, {state}, "
            f"full_lock={self.full_lock_ref}, mamba_lock={self.mamba_lock_ref})"
        )
