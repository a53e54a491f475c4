"""`Sglang054Cache`: SGLang 0.5.4's own `MambaRadixCache` and pools as a cache under test.

The pools are built as SGLang's model runner builds them for a hybrid model, on `cpu` (or any
device), with tiny Mamba shapes: `HybridReqToTokenPool` (which owns the `MambaPool`), a
`TokenToKVPoolAllocator` with no KV tensors behind it (`kvcache=None`), and `MambaRadixCache`
with `page_size=1`. Nothing of SGLang is copied; this only builds, calls and reads. Its calls are
SGLang 0.5.4's API, the base class's; the release's scheduler makes them
(`harness.protocols.sglang_0_5_4`).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness.caches.base import CacheUnderTest
from harness.caches.sglang_loader import VirtualClock, load_sglang, tiny_mamba_params
from harness.caches.sglang_releases import mamba_radix_cache_rules
from reference import Rules
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
        self.rules = self.release_rules(sgl.version)
        self.config = config
        self.device = torch.device(config.device)
        if not virtual_clock:
            sgl.cache_module.time = time
        self.clock = self._install_clock(sgl) if virtual_clock else None
        self.req_pool = sgl.HybridReqToTokenPool(**self._req_pool_args(config))
        self.mamba_pool = self.req_pool.mamba_pool
        self.mamba_slots = self._mamba_slots()
        self.kv = self._build_kv(config)
        self.cache = self._build_cache(config)
        # the padding page and the pool's pages
        self._kv_data = torch.zeros(config.kv_size + config.page_size, dtype=torch.int64, device=self.device)

    @classmethod
    def release_rules(cls, version: str) -> Rules:
        """What the model follows for this cache in SGLang `version`."""
        return mamba_radix_cache_rules(version)

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
        """`HybridReqToTokenPool`'s arguments, as the model runner passes them for one Mamba
        layer with the configuration's Mamba strategy and event loop, no speculative decoding; the later
        ones only where the release's pool takes them (0.5.7 on, 0.5.10 on, 0.5.13 on)."""
        args = dict(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            enable_memory_saver=False,
            cache_params=tiny_mamba_params(self.sgl),
            speculative_num_draft_tokens=None,
        )
        later = dict(
            mamba_spec_state_size=config.mamba_size,
            enable_mamba_extra_buffer=config.mamba_strategy == "extra_buffer",
            mamba_layer_ids=[0],
            enable_overlap_schedule=config.event_loop == "overlap",
        )
        accepted = inspect.signature(self.sgl.HybridReqToTokenPool.__init__).parameters
        args.update((name, value) for name, value in later.items() if name in accepted)
        return args

    def _build_kv(self, config: CacheConfig) -> Any:
        """The KV allocator the model runner builds, with no KV tensors behind it: by slot at page
        size 1, else `PagedTokenToKVPoolAllocator` (no sorting of freed pages: no disaggregation)."""
        if config.page_size == 1:
            return self.sgl.TokenToKVPoolAllocator(
                size=config.kv_size, dtype=torch.bfloat16, device=config.device, kvcache=None, need_sort=False
            )
        return self.sgl.PagedTokenToKVPoolAllocator(
            size=config.kv_size, page_size=config.page_size, dtype=torch.bfloat16, device=config.device, kvcache=None, need_sort=False
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

    def slots_of(self, req: Any) -> Any:
        """Where a request keeps its slots and KV lengths: on itself (`req.kv` from 0.5.16)."""
        return req

    def adopt_match(self, req: Any, match: Any) -> None:
        """`init_next_round_input`: the prefix, the last node and (read from 0.5.7 on) the
        tree's share of the row, the match's own count where it gives one (0.5.13 on)."""
        super().adopt_match(req, match)
        protected = getattr(match, "cache_protected_len", None)
        self.slots_of(req).cache_protected_len = len(match.device_indices) if protected is None else protected

    def req_slot_of(self, req: Any) -> Optional[int]:
        slot = self.slots_of(req).req_pool_idx
        return None if slot is None else int(slot)

    def mamba_slot_of(self, req: Any) -> Optional[int]:
        slot = self.slots_of(req).mamba_pool_idx
        return None if slot is None else int(slot)

    def give_mamba_slot(self, req: Any, slot: torch.Tensor) -> None:
        self.slots_of(req).mamba_pool_idx = slot

    def free_req_mamba(self, req: Any) -> None:
        kv = self.slots_of(req)
        self.mamba_slots.free(kv.mamba_pool_idx.unsqueeze(-1))
        kv.mamba_pool_idx = None

    def write_row(self, req: Any, start: int, slots: torch.Tensor) -> None:
        """`req_to_token[row, start:start + len(slots)] = slots` (`write_cache_indices` on extend,
        `assign_req_to_token_pool` on decode), the request's KV then allocated and committed up to
        the end of what was written, as `prepare_for_extend` / `prepare_for_decode` record it
        (read from 0.5.5.post1 on)."""
        end = start + slots.shape[0]
        kv = self.slots_of(req)
        self.req_pool.write((kv.req_pool_idx, slice(start, end)), slots.to(self.req_pool.req_to_token.dtype))
        kv.kv_allocated_len = max(kv.kv_allocated_len, end)
        kv.kv_committed_len = max(kv.kv_committed_len, end)

    def reset_for_retract(self, req: Any) -> None:
        """`Req.reset_for_retract`: no prefix, node or slots, nothing computed."""
        super().reset_for_retract(req)
        kv = self.slots_of(req)
        kv.kv_committed_len = kv.kv_allocated_len = kv.cache_protected_len = 0
        if isinstance(kv, SglangReq):  # the flat request's own flag (`ReqKvInfo` has none)
            kv.kv_committed_freed = False

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

    def _free_pages(self) -> List[torch.Tensor]:
        """The KV allocator's free pages (slots at page size 1): `free_pages`, then those not yet
        merged back (`release_pages`, from 0.5.20 on paged `staged_pages`)."""
        kv = self.kv
        later = getattr(kv, "staged_pages", None)
        return [kv.free_pages] + (list(later) if later is not None else [kv.release_pages])

    def free_list_tensors(self) -> List[torch.Tensor]:
        return self._free_pages() + [self.mamba_slots.free_slots]

    def kv_free_slots(self) -> List[int]:
        """The free KV slots in hand-out order: each free page's slots (see `_free_pages`)."""
        pages = torch.cat(self._free_pages()).tolist()
        ps = self.config.page_size
        return pages if ps == 1 else [page * ps + i for page in pages for i in range(ps)]


class SglangReq:
    """The fields of SGLang's `Req` that its cache and pools read and write, named as SGLang
    names them (SGLang's own `Req` needs a tokenizer and sampling parameters to build), up to
    0.5.15.post1 (0.5.16 moved a request's slots into `req.kv`). Fields a release does not read
    are simply not read: the Mamba extra buffer's (0.5.7 on, left off), the committed KV length
    (0.5.5.post1 on), the tree's share of the row (`cache_protected_len`, 0.5.7 on), the deferred
    copy-on-write (0.5.13 on) and the extend's end (`fill_len` 0.5.13, `extend_range` 0.5.15)."""

    def __init__(self, rid: int, tokens: Sequence[int], extra_key: Hashable, device: torch.device):
        self.rid = rid
        self.origin_input_ids = list(tokens)
        self.output_ids: List[int] = []
        self.fill_ids: List[int] = []
        self.extra_key = extra_key
        self.cache_salt = None  # read from 0.5.18 on
        self.req_pool_idx = None
        self.mamba_pool_idx = None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64, device=device)
        self.last_node: Any = None
        self.last_host_node: Any = None
        self.host_hit_length = 0
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_freed = False
        self.cache_protected_len = 0
        self.mamba_ping_pong_track_buffer = None
        self.mamba_next_track_idx = None
        self.mamba_last_track_seqlen = None
        self.mamba_branching_seqlen = None
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = False
        # chunks in flight, which the request pool's `alloc` reads (0.5.9 on; `inflight_middle_chunks`
        # 0.5.13 on) to let a request keep its row: the harness's requests keep a row only once
        # they have committed KV, which `alloc` accepts as well
        self.is_chunked = self.inflight_middle_chunks = 0

    def is_dllm(self) -> bool:
        """Not a diffusion language model request (0.5.9 on)."""
        return False

    def pop_committed_kv_cache(self) -> int:
        """`Req.pop_committed_kv_cache` (0.5.5.post1 on): the committed KV length, once."""
        assert not self.kv_committed_freed, f"Committed KV cache already freed ({self.kv_committed_len=})"
        self.kv_committed_freed = True
        return self.kv_committed_len

    def get_fill_ids(self) -> List[int]:
        return self.fill_ids

    @property
    def fill_len(self) -> int:
        return len(self.fill_ids)

    @property
    def extend_range(self) -> range:
        """0.5.15's extend range: the fill after the prefix."""
        return range(len(self.prefix_indices), len(self.fill_ids))
