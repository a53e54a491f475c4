"""`Sglang054Cache`: SGLang 0.5.4's own `MambaRadixCache` and pools as a cache under test.

The pools are built as SGLang's model runner builds them for a hybrid model, on `cpu` (or any
device), with tiny Mamba shapes: `HybridReqToTokenPool` (which owns the `MambaPool`), a
`TokenToKVPoolAllocator` with no KV tensors behind it (`kvcache=None`), and `MambaRadixCache`
with `page_size=1`. Nothing of SGLang is copied; this only builds, calls and reads. Its calls are
SGLang 0.5.4's API, the base class's; the release's scheduler makes them
(`harness.protocols.sglang_0_5_4`).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Hashable, List, Sequence, Tuple

import torch

from harness.caches.base import CacheUnderTest
from harness.caches.sglang_loader import VirtualClock, load_sglang, tiny_mamba_params
from strategies.config import CacheConfig


class Sglang054Cache(CacheUnderTest):
    """SGLang 0.5.4's `MambaRadixCache` with SGLang's pools, read directly for the checks.

    SGLang asserts where `impl` raises: a refused misuse and an exhausted Mamba pool are both
    `AssertionError`s, told apart by SGLang's own message. The KV data the harness writes is
    kept here, indexed by KV slot, since SGLang's allocator has no KV tensors on CPU.
    """

    name = "sglang"
    default_protocol = "sglang-0.5.4"
    misuse_error = AssertionError
    mamba_exhausted_error = AssertionError

    def __init__(self, config: CacheConfig, virtual_clock: bool = True):
        sgl = load_sglang()
        self.sgl = sgl
        self.release = sgl.version
        self.config = config
        self.device = torch.device(config.device)
        if not virtual_clock:
            sgl.cache_module.time = time
        self.clock = self._install_clock(sgl) if virtual_clock else None
        self.req_pool = sgl.HybridReqToTokenPool(**self._req_pool_args(config))
        self.mamba_pool = self.req_pool.mamba_pool
        self.mamba_slots = self._mamba_slots()
        self.kv = sgl.TokenToKVPoolAllocator(
            size=config.kv_size, dtype=torch.bfloat16, device=config.device, kvcache=None, need_sort=False
        )
        self.cache = self._build_cache(config)
        self._kv_data = torch.zeros(config.kv_size + 1, dtype=torch.int64, device=self.device)

    @staticmethod
    def _install_clock(sgl: Any) -> VirtualClock:
        """The tree module reads a virtual clock (see `harness.caches.sglang_loader`); without
        one (a benchmark), the real `time` module."""
        clock = VirtualClock()
        sgl.cache_module.time = clock
        return clock

    def advance_clock(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.advance(seconds)

    def _req_pool_args(self, config: CacheConfig) -> Dict[str, Any]:
        return dict(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            enable_memory_saver=False,
            cache_params=tiny_mamba_params(self.sgl),
            speculative_num_draft_tokens=None,
        )

    def _mamba_slots(self) -> Any:
        return self.mamba_pool

    def _build_cache(self, config: CacheConfig) -> Any:
        return self.sgl.MambaRadixCache(
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv,
            page_size=config.page_size,
            disable=False,
        )

    def is_mamba_exhausted(self, exc: BaseException) -> bool:
        return "Can not alloc mamba cache" in str(exc)

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return SglangReq(rid, tokens, extra_key, self.device)

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return self.sgl.RadixKey(token_ids=list(tokens), extra_key=extra_key)

    def write_kv(self, slots: Sequence[int], values: Sequence[int]) -> None:
        self._kv_data[self.indices(slots)] = self.indices(values)

    def kv_data(self) -> List[int]:
        return self._kv_data.tolist()

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        lru = self.cache.full_lru_list if which == "full" else self.cache.mamba_lru_list
        nxt, prv, size = lru.nxt, lru.prv, len(lru.cache)
        members: List[Any] = []
        node = lru.head
        while getattr(node, nxt) is not lru.tail:
            following = getattr(node, nxt)
            if (
                following is None
                or getattr(following, prv) is not node
                or lru.cache.get(following.id) is not following  # linked but not in its index
                or len(members) == size  # more members than the list counts (or a cycle)
            ):
                return members, False
            members.append(following)
            node = following
        return members, getattr(lru.tail, prv) is node and len(members) == size

    def free_list_tensors(self) -> List[torch.Tensor]:
        return [self.kv.free_pages, self.kv.release_pages, self.mamba_slots.free_slots]

    def kv_free_slots(self) -> List[int]:
        """The free KV slots in hand-out order: `free_pages`, then any not yet merged back."""
        free, released = self.kv.free_pages, self.kv.release_pages
        return (torch.cat((free, released)) if released.numel() else free).tolist()


class SglangReq:
    """The fields of SGLang's `Req` that its cache and pools read and write, named as SGLang
    names them (SGLang's own `Req` needs a tokenizer and sampling parameters to build)."""

    def __init__(self, rid: int, tokens: Sequence[int], extra_key: Hashable, device: torch.device):
        self.rid = rid
        self.origin_input_ids = list(tokens)
        self.output_ids: List[int] = []
        self.fill_ids: List[int] = []
        self.extra_key = extra_key
        self.req_pool_idx = None
        self.mamba_pool_idx = None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64, device=device)
        self.last_node: Any = None
        self.last_host_node: Any = None
        self.host_hit_length = 0
