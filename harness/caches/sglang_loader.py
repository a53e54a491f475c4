"""`SglangAdapter`: the same harness pointed at SGLang's own `MambaRadixCache` and pools.

The pools are built as SGLang's model runner builds them for a hybrid model, on `cpu` (or any
device), with tiny Mamba shapes: `HybridReqToTokenPool` (which owns the `MambaPool`), a
`TokenToKVPoolAllocator` with no KV tensors behind it (`kvcache=None`), and `MambaRadixCache`
with `page_size=1`. Nothing of SGLang is copied here; the adapter only builds, calls and reads.
`adapter_class` picks the adapter for the installed release: `SglangAdapter` for 0.5.4,
`Sglang0520Adapter` for 0.5.20, whose API differs (see that class).

SGLang is installed without its dependency tree (see `requirements/sglang-*.txt`). Its
`mem_cache` import chain imports torchvision at module level (DeepSeek-OCR's config in 0.5.4;
`sglang.srt.utils` and transformers' image processors in 0.5.20). PyPI's torchvision wheels are
built against a CUDA torch and do not load with the CPU build this project uses, so when
torchvision is absent `load_sglang` serves every `torchvision` import with a placeholder module:
any name in it is a stand-in that raises `ImportError` as soon as it is called. The cache and
pools never call it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from harness.adapters import CacheAdapter
from harness.config import CacheConfig
from reference import SGLANG_0_5_20

INSTALL_HINT = "scripts/install-sglang.sh 0.5.4|0.5.20 (see README, 'Checking SGLang')"
SUPPORTED = ("0.5.4", "0.5.20")
PLACEHOLDER_VERSION = "0.0"  # what a placeholder module reports as its __version__


class SglangUnavailable(ImportError):
    """SGLang (or what its `mem_cache` import chain needs) cannot be imported here."""


class _Missing:
    """Any name inside a placeholder module: its attributes are stand-ins too, and calling one
    raises `ImportError` naming it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(
            f"{self._name}: {self._name.split('.')[0]} is not installed; the harness registered a "
            f"placeholder so that SGLang's mem_cache imports (the cache never uses it)"
        )

    def __repr__(self) -> str:
        return f"<placeholder for {self._name}>"


class _Unavailable(types.ModuleType):
    """A module that imports, but whose every name is a `_Missing` stand-in."""

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `package` and every submodule of it with an `_Unavailable` module."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == self.package or fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Unavailable(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__file__ = f"<placeholder for {module.__name__}>"
        module.__version__ = PLACEHOLDER_VERSION


def _placeholder(package: str) -> None:
    """Make `package` importable as placeholders (once) if it is not installed."""
    if any(isinstance(f, _PlaceholderFinder) and f.package == package for f in sys.meta_path):
        return
    try:
        importlib.import_module(package)
    except ImportError:
        sys.meta_path.insert(0, _PlaceholderFinder(package))


@functools.lru_cache(maxsize=None)
def load_sglang() -> types.SimpleNamespace:
    """Import SGLang's cache and pools (once); `SglangUnavailable` says why when that fails."""
    os.environ.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
    _placeholder("torchvision")
    try:
        sglang = importlib.import_module("sglang")
        cache_mod = importlib.import_module("sglang.srt.mem_cache.mamba_radix_cache")
        pool_mod = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        alloc_mod = importlib.import_module("sglang.srt.mem_cache.allocator")
        radix_mod = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        mamba_utils = importlib.import_module("sglang.srt.configs.mamba_utils")
    except ImportError as exc:
        raise SglangUnavailable(f"SGLang cannot be imported ({exc}); install it with: {INSTALL_HINT}") from exc
    version = getattr(sglang, "__version__", "unknown")
    if version not in SUPPORTED:
        raise SglangUnavailable(
            f"SGLang {version} is installed, but the adapter supports {', '.join(SUPPORTED)}; "
            f"install one with: {INSTALL_HINT}"
        )
    sgl = types.SimpleNamespace(
        version=version,
        MambaRadixCache=cache_mod.MambaRadixCache,
        HybridReqToTokenPool=pool_mod.HybridReqToTokenPool,
        TokenToKVPoolAllocator=alloc_mod.TokenToKVPoolAllocator,
        RadixKey=radix_mod.RadixKey,
        Mamba2CacheParams=mamba_utils.Mamba2CacheParams,
        Mamba2StateShape=mamba_utils.Mamba2StateShape,
    )
    if version != "0.5.4":
        params = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        sgl.CacheInitParams = importlib.import_module("sglang.srt.mem_cache.cache_init_params").CacheInitParams
        sgl.MatchPrefixParams, sgl.InsertParams, sgl.EvictParams = (
            params.MatchPrefixParams,
            params.InsertParams,
            params.EvictParams,
        )
        sgl.ReqKvInfo = importlib.import_module("sglang.srt.managers.schedule_batch").ReqKvInfo
        sgl.runtime_context = importlib.import_module("sglang.srt.runtime_context")
    return sgl


def sglang_unavailable() -> str:
    """Why SGLang cannot be used here, or '' when it can."""
    try:
        load_sglang()
    except SglangUnavailable as exc:
        return str(exc)
    return ""


def sglang_version() -> str:
    """The installed SGLang's version, or raise `SglangUnavailable`."""
    return load_sglang().version


def adapter_class() -> type:
    """`SglangAdapter` for SGLang 0.5.4, `Sglang0520Adapter` for 0.5.20."""
    return SglangAdapter if sglang_version() == "0.5.4" else Sglang0520Adapter


def _tiny_mamba_params(sgl: types.SimpleNamespace) -> Any:
    """One Mamba layer with one-element states: as small as SGLang's shapes allow."""
    return sgl.Mamba2CacheParams(
        shape=sgl.Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=2,
            n_groups=1,
            num_heads=1,
            head_dim=1,
            state_size=1,
            conv_kernel=2,
        ),
        layers=[0],
    )


class SglangAdapter(CacheAdapter):
    """SGLang 0.5.4's `MambaRadixCache` with SGLang's pools, read directly for the checks.

    SGLang asserts where `impl` raises: a refused misuse and an exhausted Mamba pool are both
    `AssertionError`s, told apart by SGLang's own message. The KV data the harness writes is
    kept here, indexed by KV slot, since SGLang's allocator has no KV tensors on CPU.
    """

    name = "sglang"
    misuse_error = AssertionError
    mamba_exhausted_error = AssertionError
    req_alloc_fails_gracefully = False

    def __init__(self, config: CacheConfig):
        sgl = load_sglang()
        self.sgl = sgl
        self.config = config
        self.device = torch.device(config.device)
        self.req_pool = self._build_req_pool(config)
        self.mamba_pool = self.req_pool.mamba_pool
        self.mamba_slots = self._mamba_slots()
        self.kv = sgl.TokenToKVPoolAllocator(
            size=config.kv_size, dtype=torch.bfloat16, device=config.device, kvcache=None, need_sort=False
        )
        self.cache = self._build_cache(config)
        self._kv_data = torch.zeros(config.kv_size + 1, dtype=torch.int64, device=self.device)

    def _build_req_pool(self, config: CacheConfig) -> Any:
        return self.sgl.HybridReqToTokenPool(**self._req_pool_args(config))

    def _req_pool_args(self, config: CacheConfig) -> Dict[str, Any]:
        return dict(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            enable_memory_saver=False,
            cache_params=_tiny_mamba_params(self.sgl),
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

    def version(self) -> str:
        return self.sgl.version

    def is_mamba_exhausted(self, exc: BaseException) -> bool:
        return "Can not alloc mamba cache" in str(exc)

    def key(self, tokens: Sequence[int], extra_key: Hashable) -> Any:
        return self.sgl.RadixKey(list(tokens), extra_key)

    def write_kv(self, slots: Sequence[int], tokens: Sequence[int]) -> None:
        self._kv_data[self.indices(slots)] = self.indices(tokens)

    def read_kv(self, indices: torch.Tensor) -> List[int]:
        return self._kv_data[indices.to(torch.int64)].tolist()

    def kv_payload(self) -> List[int]:
        return self._kv_data.tolist()

    def _lru(self, which: str):
        return self.cache.full_lru_list if which == "full" else self.cache.mamba_lru_list

    def read_lru(self, which: str) -> Tuple[List[Any], bool]:
        lru = self._lru(which)
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


class Req0520:
    """A request as SGLang 0.5.20's cache reads it, its KV bookkeeping in SGLang's own
    `ReqKvInfo` (`req.kv`). The driver's names (`req_pool_idx`, `fill_ids`) map onto it."""

    def __init__(self, kv_info: Any, rid: int, tokens: Sequence[int], extra_key: Hashable):
        self.rid = rid
        self.origin_input_ids = list(tokens)
        self.output_ids: List[int] = []
        self.extra_key = extra_key
        self.cache_salt = None
        self.kv = kv_info
        self.fill_ids: List[int] = []
        self.prefix_indices: Optional[torch.Tensor] = None
        self.last_node: Any = None

    def get_fill_ids(self) -> List[int]:
        return self.fill_ids

    @property
    def req_pool_idx(self) -> Optional[int]:
        return self.kv.req_pool_idx


class Sglang0520Adapter(SglangAdapter):
    """SGLang 0.5.20's `MambaRadixCache`, whose API and some behaviours differ from 0.5.4's.

    API: the cache is built from `CacheInitParams` and reads process-wide server args (the
    adapter publishes a minimal set through SGLang's own test override, as SGLang's tests do);
    `match_prefix`, `insert` and `evict` take parameter objects; requests keep their slots in
    `req.kv`; Mamba slots come from `req_to_token_pool.mamba_allocator`; `cache_finished_req`
    takes `kv_len_to_handle` and no longer frees the request slot (the scheduler's
    `release_kv_cache` does, right after); copy-on-write is deferred to the forward pass, which
    the adapter stands in for by copying right after the match.

    Behaviour, as `reference.SGLANG_0_5_20` names it: the Mamba LRU is refreshed only for the
    state a match uses and for states new to the tree; an insert that ends on an existing node
    refreshes it; insert frees the caller's duplicate KV itself; freed Mamba slots keep stale
    data; Mamba and request slots start at 1, and request slots are taken from the tail.
    """

    rules = SGLANG_0_5_20
    _chunk_size = 64  # the Mamba cache chunk size SGLang's own test kits pin

    def _req_pool_args(self, config: CacheConfig) -> Dict[str, Any]:
        return dict(
            super()._req_pool_args(config),
            mamba_spec_state_size=config.mamba_size,
            mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False,
            enable_overlap_schedule=False,
        )

    def _mamba_slots(self) -> Any:
        return self.req_pool.mamba_allocator

    def _build_cache(self, config: CacheConfig) -> Any:
        _publish_server_args(self.sgl.runtime_context, self._chunk_size)
        return self.sgl.MambaRadixCache(
            self.sgl.CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_pool,
                token_to_kv_pool_allocator=self.kv,
                page_size=config.page_size,
            )
        )

    def new_req(self, rid: int, tokens: Sequence[int], extra_key: Hashable) -> Req0520:
        return Req0520(self.sgl.ReqKvInfo(), rid, tokens, extra_key)

    def mamba_slot_of(self, req: Any) -> Optional[int]:
        return None if req.kv.mamba_pool_idx is None else int(req.kv.mamba_pool_idx)

    def mamba_tensors(self) -> List[torch.Tensor]:
        cache = self.mamba_pool.mamba_cache
        return [cache.temporal, *cache.conv]

    def match_prefix(self, key: Any, req: Any = None) -> Any:
        match = self.cache.match_prefix(self.sgl.MatchPrefixParams(key=key, cow_mamba=req is not None, req=req))
        if req is not None and req.kv.mamba_cow_src_index is not None:
            # the forward pass's deferred copy-on-write (ScheduleBatch's deferred COW)
            self.mamba_pool.copy_from(req.kv.mamba_cow_src_index, req.kv.mamba_pool_idx.unsqueeze(0))
            req.kv.mamba_cow_src_index = None
        return match

    def adopt_match(self, req: Any, match: Any) -> None:
        super().adopt_match(req, match)
        req.kv.cache_protected_len = len(match.device_indices)

    def insert(self, key: Any, kv: torch.Tensor, mamba: torch.Tensor) -> Tuple[int, bool]:
        result = self.cache.insert(self.sgl.InsertParams(key=key, value=kv, mamba_value=mamba))
        return result.prefix_len, result.mamba_exist

    def cache_finished_req(self, req: Any) -> None:
        # what release_kv_cache does: KV is held for every token computed (all but the last
        # output), then the request slot goes back
        computed = len(req.origin_input_ids) + len(req.output_ids) - 1
        self.cache.cache_finished_req(req, kv_len_to_handle=computed)
        self.req_pool.free(req)

    def evict(self, num_tokens: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=num_tokens))

    def alloc_req_slot(self, req: Any) -> Optional[int]:
        got = self.req_pool.alloc([req])
        return None if got is None else got[0]

    def free_req_slot(self, req: Any, free_mamba: bool) -> None:
        if free_mamba:
            self.req_pool.free_mamba_cache(req)
        self.req_pool.free(req)


@functools.lru_cache(maxsize=None)
def _publish_server_args(runtime_context: types.ModuleType, chunk_size: int) -> Any:
    """Publish (once per process) the server args 0.5.20's cache reads: only the Mamba cache
    chunk size, pinned as SGLang's own test kits pin it, since deriving it needs a model."""
    return runtime_context.get_context().override_server_args(_mamba_cache_chunk_size=chunk_size).install()


__all__ = [
    "SUPPORTED",
    "Sglang0520Adapter",
    "SglangAdapter",
    "SglangUnavailable",
    "adapter_class",
    "load_sglang",
    "sglang_unavailable",
    "sglang_version",
]
