"""`SglangAdapter`: the same harness pointed at SGLang's own `MambaRadixCache` and pools.

The pools are built as SGLang's model runner builds them for a hybrid model, on `cpu` (or any
device), with tiny Mamba shapes: `HybridReqToTokenPool` (which owns the `MambaPool`), a
`TokenToKVPoolAllocator` with no KV tensors behind it (`kvcache=None`), and `MambaRadixCache`
with `page_size=1`. Nothing of SGLang is copied here; the adapter only builds and reads.

SGLang is installed without its dependency tree (see `requirements/sglang-*.txt`). Its
`mem_cache` import chain reaches `sglang.srt.configs`, whose DeepSeek-OCR config imports
`torchvision.transforms` at module level; PyPI's torchvision wheels need a torch build other than
the CPU one this project uses, so when torchvision is absent `load_sglang` registers a placeholder
module for it that raises as soon as anything in it is used. The cache and pools never use it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import os
import sys
import types
from typing import Any, Hashable, List, Sequence

import torch

from harness.adapters import CacheAdapter
from harness.config import CacheConfig

INSTALL_HINT = "scripts/install-sglang.sh 0.5.4 (see README, 'Checking SGLang')"
SUPPORTED = ("0.5.4",)
# 0.5.20 builds its pools from global server args (HybridReqToTokenPool takes a spec-state size,
# Mamba layer ids and extra/ping-pong buffers; MambaRadixCache takes CacheInitParams); not done yet.


class SglangUnavailable(ImportError):
    """SGLang (or what its `mem_cache` import chain needs) cannot be imported here."""


class _Unavailable(types.ModuleType):
    """A module that is importable but raises on first use of any attribute."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(
            f"{self.__name__}.{attr}: {self.__name__} is not installed; the harness registered a "
            f"placeholder so that SGLang's mem_cache imports (it is never used by the cache)"
        )


def _placeholder(name: str) -> None:
    parent = None
    for depth, part in enumerate(name.split(".")):
        full = ".".join(name.split(".")[: depth + 1])
        module = sys.modules.get(full)
        if module is None:
            module = _Unavailable(full)
            module.__spec__ = importlib.machinery.ModuleSpec(full, None)
            module.__path__ = []
            sys.modules[full] = module
        if parent is not None:
            setattr(parent, part, module)
        parent = module


@functools.lru_cache(maxsize=None)
def load_sglang() -> types.SimpleNamespace:
    """Import SGLang's cache and pools (once); `SglangUnavailable` says why when that fails."""
    os.environ.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
    try:
        importlib.import_module("torchvision")
    except ImportError:
        _placeholder("torchvision.transforms")
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
            f"SGLang {version} is installed, but the adapter supports {', '.join(SUPPORTED)} "
            f"(see docs/findings.md for 0.5.20); install one with: {INSTALL_HINT}"
        )
    return types.SimpleNamespace(
        version=version,
        MambaRadixCache=cache_mod.MambaRadixCache,
        HybridReqToTokenPool=pool_mod.HybridReqToTokenPool,
        TokenToKVPoolAllocator=alloc_mod.TokenToKVPoolAllocator,
        RadixKey=radix_mod.RadixKey,
        Mamba2CacheParams=mamba_utils.Mamba2CacheParams,
        Mamba2StateShape=mamba_utils.Mamba2StateShape,
    )


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


class SglangAdapter(CacheAdapter):
    """SGLang's `MambaRadixCache` with SGLang's pools, read directly for the checks.

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
        cache_params = sgl.Mamba2CacheParams(
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
        self.req_pool = sgl.HybridReqToTokenPool(
            size=config.req_size,
            mamba_size=config.mamba_size,
            max_context_len=config.max_context_len,
            device=config.device,
            enable_memory_saver=False,
            cache_params=cache_params,
            speculative_num_draft_tokens=None,
        )
        self.mamba_pool = self.req_pool.mamba_pool
        self.kv = sgl.TokenToKVPoolAllocator(
            size=config.kv_size, dtype=torch.bfloat16, device=config.device, kvcache=None, need_sort=False
        )
        self.cache = sgl.MambaRadixCache(
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv,
            page_size=config.page_size,
            disable=False,
        )
        self._kv_data = torch.zeros(config.kv_size + 1, dtype=torch.int64, device=self.device)

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

    def lru_members(self, which: str) -> List[Any]:
        lru = self._lru(which)
        members = []
        node = getattr(lru.head, lru.nxt)
        while node is not None and node is not lru.tail and len(members) <= len(lru.cache):
            members.append(node)
            node = getattr(node, lru.nxt)
        return members

    def lru_links_ok(self, which: str) -> bool:
        lru = self._lru(which)
        count = 0
        node = lru.head
        while getattr(node, lru.nxt) is not lru.tail:
            following = getattr(node, lru.nxt)
            if following is None or getattr(following, lru.prv) is not node or count > len(lru.cache):
                return False
            if lru.cache.get(following.id) is not following:
                return False
            node = following
            count += 1
        return getattr(lru.tail, lru.prv) is node and count == len(lru.cache)


__all__ = ["SUPPORTED", "SglangAdapter", "SglangUnavailable", "load_sglang", "sglang_unavailable", "sglang_version"]
