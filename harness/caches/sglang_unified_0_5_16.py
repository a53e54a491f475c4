"""`SglangUnified0516Cache`: 0.5.16's `UnifiedRadixCache` (Full + Mamba), the first its scheduler
builds for hybrid Mamba models, as a cache under test.

Its calls and requests are 0.5.17's (`harness.caches.sglang_unified_0_5_17`). What differs is the
tree: there is no tree core yet, so the cache itself holds the root, the nodes (node objects are
the handles it gives out: `last_device_node` is a node) and the LRU lists; the component types
live in `mem_cache/unified_cache_components`.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.caches.sglang_unified_0_5_17 import SglangUnified0517Cache


class SglangUnified0516Cache(SglangUnified0517Cache):
    """0.5.16's `UnifiedRadixCache` (see the module docstring)."""

    @property
    def tree(self) -> Any:
        """The cache holds the nodes and the LRU lists itself."""
        return self.cache

    def node_object(self, node: Any) -> Any:
        return node

    def root_handle(self) -> Any:
        return self.cache.root_node

    def _path_kv(self, node: Any) -> torch.Tensor:
        """The KV slots from the root to `node`, read up its parent links."""
        parts = []
        while node is not None and node is not self.cache.root_node:
            value = node.component_data[self.FULL].value
            parts.append(value if value is not None else torch.empty((0,), dtype=torch.int64, device=self.device))
            node = node.parent
        if not parts:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        return torch.cat([p.to(torch.int64) for p in reversed(parts)])
