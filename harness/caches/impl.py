"""`ImplCache`: this repository's `impl` (or a subclass of its cache, for planted bugs) as a cache
under test."""

from __future__ import annotations

from typing import Any, Callable, Hashable, List, Sequence, Tuple

import torch

import impl
from harness.caches.base import CacheUnderTest
from strategies.config import CacheConfig

# Mamba state shapes with room for a digest (8 elements each); the harness's stand-in forward
# pass writes one into every slot it computes
CONV_SHAPE = (8,)
TEMPORAL_SHAPE = (2, 4)


def class_impl_name(cache_class: type) -> str:
    """The `--impl MODULE:CLASS` name of a subclass of impl's cache."""
    return f"{cache_class.__module__}:{cache_class.__qualname__}"


def read_lru(tree: Any, which: str) -> Tuple[List[Any], bool]:
    """`CacheUnderTest.read_lru` of impl's tree `tree`: its "full" or "mamba" list walked by its
    links, the ticks falling towards the tail."""
    lru = tree.full_lru_list if which == "full" else tree.mamba_lru_list
    head, tail, size = lru._head, lru._tail, len(lru)
    members: List[Any] = []
    link = head
    while link.next is not tail:
        following = link.next
        if (
            following is None
            or following.prev is not link
            or (link is not head and following.tick >= link.tick)  # ticks fall towards the tail
            or len(members) == size  # more members than the list counts (or a cycle)
        ):
            return members, False
        members.append(following.node)
        link = following
    return members, tail.prev is link and len(members) == size


class ImplCache(CacheUnderTest):
    """`impl.MambaRadixCache` with `impl`'s pools, checking mode on."""

    name = "impl"
    release = impl.__version__
    misuse_error = impl.CacheMisuseError
    refuses_detached_nodes = True
    direct_api = True
    mamba_exhausted_error = impl.MambaPoolExhaustedError

    def __init__(self, config: CacheConfig, cache_class: Callable[..., Any] = impl.MambaRadixCache):
        self.config = config
        if cache_class is not impl.MambaRadixCache:
            self.name = class_impl_name(cache_class)  # a trace of it replays on it by default
        self.kv = impl.TokenToKVPoolAllocator(config.kv_size, device=config.device, debug=True)
        self.req_pool = impl.HybridReqToTokenPool(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            conv_shape=CONV_SHAPE,
            temporal_shape=TEMPORAL_SHAPE,
            debug=True,
        )
        self.mamba_pool = self.mamba_slots = self.req_pool.mamba_pool
        self.cache = cache_class(self.req_pool, self.kv, page_size=config.page_size)
        self.device = self.kv.device

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> impl.Req:
        return impl.Req(rid, list(tokens), extra_key)

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> impl.RadixKey:
        return impl.RadixKey(list(tokens), extra_key)

    def write_kv(self, slots: Sequence[int], values: Sequence[int]) -> None:
        self.kv.write_payload(self.indices(slots), self.indices(values))

    def kv_data(self) -> List[int]:
        return self.kv.payload[:, 0].tolist()

    def mamba_tensors(self) -> List[torch.Tensor]:
        return [self.mamba_pool.states]  # conv and temporal are views of it: one read for both

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        return read_lru(self.cache, which)

    def free_list_tensors(self) -> List[torch.Tensor]:
        lists = (self.kv._free, self.kv._released, self.mamba_pool._free)
        return [tensor for free in lists for tensor in (free._head, *free._tail)]

    def kv_free_slots(self) -> List[int]:
        return self.kv.free_slots.tolist()

    def format_tree(self) -> str:
        return self.cache.format_tree()
