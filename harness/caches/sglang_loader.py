"""Importing SGLang's cache and pools on a CPU machine, and the clock its tree reads.

SGLang is installed without its dependency tree (see `requirements/sglang-*.txt`), or put on
the path from the release store (`harness.releases.store`). Its `mem_cache` import chain imports
two CUDA-only packages at module level: torchvision (DeepSeek-OCR's config in 0.5.4;
`sglang.srt.utils` and transformers' image processors later) and, from 0.5.6 to 0.5.9, sgl_kernel
(the host memory pool's transfer kernels). PyPI's wheels of both are built against a CUDA torch
and do not load with the CPU build this project uses, so when one is absent `load_sglang` serves
every import of it with a placeholder module: any name in it is a stand-in that raises
`ImportError` as soon as it is called. The cache and pools never call them.

SGLang 0.5.4's tree stamps nodes with `time.monotonic()` and its idle self-check compares those
stamps with its LRU lists, so its verdict depends on how fast the calls come. `VirtualClock`
stands in for the `time` module inside that one module: every read advances it one microsecond
(scheduler code runs that fast), and a forward pass lets ten milliseconds pass. A trace then
replays to the same verdict every time; nothing SGLang calls is changed, only what the clock says.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import time
import types
from typing import Any, Dict, Optional

from harness.caches.sglang_api import check_api
from harness.caches.sglang_releases import RELEASES, is_development, known_release, mamba_era, serves_unified, ships_mamba_radix_cache

INSTALL_HINT = "scripts/install-sglang.sh 0.5.4|0.5.20|0.5.23, or any release through the release store (see README, 'Checking SGLang')"
CUDA_ONLY_PACKAGES = ("torchvision", "sgl_kernel")
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


class VirtualClock:
    """The `time` module as one SGLang module sees it: `monotonic()` advances one microsecond a
    read, `advance(seconds)` lets time pass; every other name is the real module's."""

    STEP = 1e-6

    def __init__(self, start: float = 1000.0):
        self.now = start

    def monotonic(self) -> float:
        self.now += self.STEP
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@functools.lru_cache(maxsize=None)
def load_sglang() -> types.SimpleNamespace:
    """Import SGLang's cache and pools (once); `SglangUnavailable` says why when that fails."""
    os.environ.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
    for package in CUDA_ONLY_PACKAGES:
        _placeholder(package)
    try:
        sglang = importlib.import_module("sglang")
        version = getattr(sglang, "__version__", "unknown")
        if not (known_release(version) or is_development(version)):
            raise SglangUnavailable(
                f"SGLang {version} is installed, but the harness drives {RELEASES[0]} .. {RELEASES[-1]} and newer "
                f"development versions; install one with: {INSTALL_HINT}"
            )
        pool_mod = importlib.import_module("sglang.srt.mem_cache.memory_pool")
        alloc_mod = importlib.import_module("sglang.srt.mem_cache.allocator")  # a package from 0.5.13
        radix_mod = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        mamba_utils = importlib.import_module("sglang.srt.configs.mamba_utils")
        sgl = types.SimpleNamespace(
            version=version,
            HybridReqToTokenPool=pool_mod.HybridReqToTokenPool,
            TokenToKVPoolAllocator=alloc_mod.TokenToKVPoolAllocator,
            PagedTokenToKVPoolAllocator=getattr(alloc_mod, "PagedTokenToKVPoolAllocator", None),
            RadixKey=radix_mod.RadixKey,
            Mamba2CacheParams=mamba_utils.Mamba2CacheParams,
            Mamba2StateShape=mamba_utils.Mamba2StateShape,
        )
        if ships_mamba_radix_cache(version):
            sgl.cache_module = importlib.import_module("sglang.srt.mem_cache.mamba_radix_cache")
            sgl.MambaRadixCache = sgl.cache_module.MambaRadixCache
            # the tree logs its self-check failures before raising them; the harness reports them
            logging.getLogger(sgl.cache_module.__name__).setLevel(logging.CRITICAL)
        if not (ships_mamba_radix_cache(version) and mamba_era(version) == "kwargs"):
            _load_parameter_api(sgl)  # the keyword era (0.5.4's API) calls none of it
        if serves_unified(version):
            _load_unified_cache(sgl)
        if is_development(version):
            moved = check_api(version, RELEASES[-1])
            if moved:
                raise SglangUnavailable(moved)
    except SglangUnavailable:
        raise
    except ImportError as exc:
        raise SglangUnavailable(f"SGLang cannot be imported ({exc}); install it with: {INSTALL_HINT}") from exc
    return sgl


def _optional(module: str, name: Optional[str] = None) -> Any:
    """`module` (or `module.name`), or None where the release lacks it (the era before it came in)."""
    try:
        found = importlib.import_module(module)
        return found if name is None else getattr(found, name, None)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("sglang"):
            return None
        raise


def _load_parameter_api(sgl: types.SimpleNamespace) -> None:
    """The parameter objects, request record and process context of the releases that have them
    (None in a release before each came in: `CacheInitParams` 0.5.6, `MatchPrefixParams` 0.5.8,
    `InsertParams` and `EvictParams` 0.5.9, the runtime context 0.5.15, `ReqKvInfo` 0.5.16)."""
    params = "sglang.srt.mem_cache.base_prefix_cache"
    sgl.CacheInitParams = _optional("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
    sgl.MatchPrefixParams, sgl.InsertParams, sgl.EvictParams = (
        _optional(params, name) for name in ("MatchPrefixParams", "InsertParams", "EvictParams")
    )
    batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    sgl.ReqKvInfo, sgl.Req, sgl.FINISH_LENGTH, sgl.FINISH_ABORT = (
        getattr(batch, "ReqKvInfo", None), batch.Req, batch.FINISH_LENGTH, batch.FINISH_ABORT
    )
    sgl.SamplingParams = importlib.import_module("sglang.srt.sampling.sampling_params").SamplingParams
    sgl.runtime_context = _optional("sglang.srt.runtime_context")
    sgl.common = importlib.import_module("sglang.srt.mem_cache.common")


def _load_unified_cache(sgl: types.SimpleNamespace) -> None:
    """`UnifiedRadixCache`, its component types and its tree-core registry."""
    unified = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
    sgl.unified_module = unified
    sgl.UnifiedRadixCache = unified.UnifiedRadixCache
    sgl.ComponentType = _optional("sglang.srt.mem_cache.unified_cache.component_type", "ComponentType") or _optional(
        "sglang.srt.mem_cache.unified_cache_components.tree_component", "ComponentType"
    )  # its home from 0.5.17; 0.5.16's
    sgl.envs = importlib.import_module("sglang.srt.environ").envs
    logging.getLogger(unified.__name__).setLevel(logging.CRITICAL)


MAMBA_CACHE_CHUNK_SIZE = 64  # the Mamba cache chunk size SGLang's own test kits pin
PAGE_SIZE = 1  # the page size of every cache built outside a release's own scheduler (which publishes its own)


class PublishedServerArgs(types.SimpleNamespace):
    """The server args a release before the runtime context reads: the one setting the cache
    reads; any other is named in the error."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the harness publishes only {sorted(vars(self))} of the server args; SGLang read {name!r}")


_published: Dict[str, Any] = {}  # release -> what published its server args (once per process)


def publish_server_args(sgl: types.SimpleNamespace) -> Any:
    """Publish (once per process) the server args the cache reads: the page size and the Mamba
    cache chunk size, pinned as SGLang's own test kits pin it, since deriving it needs a model: through the
    runtime context's test override where it has one (as SGLang's tests do), else through
    `set_global_server_args_for_scheduler` where the release has it (0.5.5 on)."""
    if sgl.version in _published:
        return _published[sgl.version]
    published = None
    context = None if sgl.runtime_context is None else sgl.runtime_context.get_context()
    if hasattr(context, "override_server_args"):
        # the page size too: 0.5.16's release_kv_cache reads it from the server args
        published = context.override_server_args(_mamba_cache_chunk_size=MAMBA_CACHE_CHUNK_SIZE, page_size=PAGE_SIZE).install()
    else:
        server_args = importlib.import_module("sglang.srt.server_args")
        if hasattr(server_args, "set_global_server_args_for_scheduler"):
            published = PublishedServerArgs(mamba_cache_chunk_size=MAMBA_CACHE_CHUNK_SIZE)
            server_args.set_global_server_args_for_scheduler(published)
    _published[sgl.version] = published
    return published


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


def development_note(version: Optional[str] = None) -> str:
    """One line saying how a development version (default: the installed SGLang's) is driven
    ('' for a release)."""
    version = sglang_version() if version is None else version
    if not is_development(version):
        return ""
    return (f"SGLang {version} is a development version: driven by the adapter, scheduler protocol and rules of "
            f"{RELEASES[-1]}, the newest release the harness knows (its API checked against {RELEASES[-1]}'s calls)")


def tiny_mamba_params(sgl: types.SimpleNamespace) -> Any:
    """One Mamba layer with states of 8 elements each (conv 8 x 1, temporal 2 x 2 x 2): the
    smallest SGLang's shapes allow that still hold a digest (`harness.digest`)."""
    return sgl.Mamba2CacheParams(
        shape=sgl.Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=4,
            n_groups=1,
            num_heads=2,
            head_dim=2,
            state_size=2,
            conv_kernel=2,
        ),
        layers=[0],
    )
