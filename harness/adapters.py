"""Adapters: how the harness builds, drives and reads a cache under test.

`ImplAdapter` wraps this repository's `impl`. An adapter builds the pools and cache from a
`CacheConfig`, makes requests and keys, maps nodes to paths, and reads a `Snapshot` straight off
the implementation's nodes, list links, counters and pools.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence

import torch

import impl
from harness.config import CacheConfig
from harness.snapshot import NodeView, Path, Snapshot

ROOT_PATH: Path = (None, ())


class ImplAdapter:
    """The harness's handle on `impl` (or a subclass of its cache, for planted bugs)."""

    name = "impl"
    misuse_error = impl.CacheMisuseError
    mamba_exhausted_error = impl.MambaPoolExhaustedError

    def __init__(self, config: CacheConfig, cache_class: Callable[..., Any] = impl.MambaRadixCache):
        self.config = config
        self.kv = impl.TokenToKVPoolAllocator(config.kv_size, device=config.device, debug=True)
        self.req_pool = impl.HybridReqToTokenPool(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            debug=True,
        )
        self.mamba_pool = self.req_pool.mamba_pool
        self.cache = cache_class(self.req_pool, self.kv, page_size=config.page_size)
        self.device = torch.device(config.device)

    def version(self) -> str:
        return impl.__version__

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return impl.Req(rid, list(tokens), extra_key)

    @staticmethod
    def key(tokens: Sequence[int], extra_key: Hashable) -> impl.RadixKey:
        return impl.RadixKey(list(tokens), extra_key)

    def indices(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(slots), dtype=torch.int64, device=self.device)

    def path_of(self, node: Any) -> Path:
        """The (extra_key, tokens from the root) name of a node."""
        segments = []
        extra = None
        while node is not self.cache.root_node:
            segments.append(node.key.token_ids)
            extra = node.key.extra_key
            node = node.parent
        return (extra, tuple(t for seg in reversed(segments) for t in seg)) if segments else ROOT_PATH

    def snapshot(self) -> Snapshot:
        cache = self.cache
        nodes: Dict[Path, NodeView] = {}
        path_by_id: Dict[int, Path] = {}
        stack = [(cache.root_node, ROOT_PATH)]
        root = cache.root_node
        while stack:
            node, path = stack.pop()
            parent = None if node is root else path
            for child in node.children.values():
                key = child.key
                child_path = (key.extra_key, path[1] + tuple(key.token_ids))
                mamba = child.mamba_value
                nodes[child_path] = NodeView(
                    child_path,
                    parent,
                    tuple(child.value.tolist()),
                    None if mamba is None else mamba.tolist()[0],
                    child.full_lock_ref,
                    child.mamba_lock_ref,
                    len(child.children),
                )
                path_by_id[id(child)] = child_path
                stack.append((child, child_path))

        def listed(lru) -> List[Path]:
            return [path_by_id.get(id(n), ("<not in tree>", (n.id,))) for n in lru.iter_mru_to_lru()]

        return Snapshot(
            nodes=nodes,
            full_lru=listed(cache.full_lru_list),
            mamba_lru=listed(cache.mamba_lru_list),
            full_links_ok=cache.full_lru_list.links_consistent(),
            mamba_links_ok=cache.mamba_lru_list.links_consistent(),
            sizes=(
                cache.full_evictable_size(),
                cache.full_protected_size(),
                cache.mamba_evictable_size(),
                cache.mamba_protected_size(),
            ),
            root_locks=(cache.root_node.full_lock_ref, cache.root_node.mamba_lock_ref),
            kv_free=self.kv.free_slots().tolist(),
            mamba_free=self.mamba_pool.free_slots.tolist(),
            req_free=list(self.req_pool.free_slots),
            kv_size=self.config.kv_size,
            mamba_size=self.config.mamba_size,
            req_size=self.config.req_size,
        )

    def format_tree(self) -> str:
        return self.cache.format_tree()

    def kv_payload(self) -> List[int]:
        """Payload (the token id written there) of every KV slot 0..size."""
        return self.kv.payload[:, 0].tolist()

    def mamba_states(self) -> List[Optional[float]]:
        """Per Mamba slot: its state value if every element agrees, else None."""
        cache = self.mamba_pool.mamba_cache
        states = torch.cat((cache.conv.flatten(2), cache.temporal.flatten(2)), 2)[:, : self.config.mamba_size]
        low, high = torch.stack((states.amin((0, 2)), states.amax((0, 2)))).tolist()
        return [lo if lo == hi else None for lo, hi in zip(low, high)]

    def req_row(self, req_slot: int, length: int) -> List[int]:
        return self.req_pool.req_to_token[req_slot, :length].tolist()

    def mamba_slot_of(self, req: Any) -> Optional[int]:
        return None if req.mamba_pool_idx is None else int(req.mamba_pool_idx)


def adapter_for(impl_name: str) -> Callable[[CacheConfig], Any]:
    """`impl` (this repository's cache) or `MODULE:CLASS`, a `MambaRadixCache` subclass.

    Raises `ValueError` naming the argument when it cannot be loaded.
    """
    if impl_name == "impl":
        return ImplAdapter
    module_name, _, class_name = impl_name.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--impl must be 'impl' or MODULE:CLASS, got {impl_name!r}")
    try:
        cache_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--impl {impl_name}: cannot load it ({exc})") from None
    return functools.partial(ImplAdapter, cache_class=cache_class)
