"""The caches under test, one module per cache family and API era.

  impl            this repository's `impl` (`harness.caches.impl`)
  sglang          SGLang's own hybrid cache and pools, for the installed release (any from
                  0.5.3.post2 to 0.5.23, `harness.caches.sglang_releases`): its `MambaRadixCache`
                  in that release's API era (`MAMBA_ERA_ADAPTERS`) where it ships one, else its
                  `UnifiedRadixCache` on the Python tree
  sglang-CORE     SGLang's `UnifiedRadixCache` (Full + Mamba) on tree core CORE: `python`, `rust`,
                  or `parity` (both side by side, `harness.caches.parity`); 0.5.16 on (`python`
                  only before 0.5.19), an adapter per era (`sglang_unified_eras.unified_factory`)
  MODULE:CLASS    a subclass of `impl.MambaRadixCache` (a planted bug, a patched cache)

`cache_factory(name)` gives a callable building the cache from a `CacheConfig`;
`impl_name(impl, tree_core)` spells `--impl sglang --tree-core CORE` as `sglang-CORE`.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable, List, Optional

from impl import MambaRadixCache
from harness.caches.base import CacheUnderTest
from harness.caches.impl import ImplCache, class_impl_name
from strategies.config import CacheConfig

CacheFactory = Callable[[CacheConfig], CacheUnderTest]


TREE_CORES = ("python", "rust", "parity")


def impl_name(impl: str, tree_core: Optional[str]) -> str:
    """`--impl sglang --tree-core CORE` as one name (`sglang-CORE`); ValueError for a tree core
    named with another cache, or an unknown one."""
    if tree_core is None:
        return impl
    if impl != "sglang":
        raise ValueError(f"--tree-core applies to --impl sglang only, not to {impl!r}")
    if tree_core not in TREE_CORES:
        raise ValueError(f"--tree-core must be one of {list(TREE_CORES)}, got {tree_core!r}")
    return f"sglang-{tree_core}"


# the adapter of each API era of `MambaRadixCache` (`harness.caches.sglang_releases.MAMBA_ERAS`)
MAMBA_ERA_ADAPTERS = {
    "kwargs": ("harness.caches.sglang_0_5_4", "Sglang054Cache"),
    "init-params": ("harness.caches.sglang_0_5_6", "Sglang056Cache"),
    "params": ("harness.caches.sglang_0_5_9", "Sglang059Cache"),
    "mamba-allocator": ("harness.caches.sglang_0_5_13", "Sglang0513Cache"),
    "req-kv": ("harness.caches.sglang_0_5_20", "Sglang0520Cache"),
}


def sglang_cache_class(tree_core: Optional[str] = None) -> CacheFactory:
    """The cache under test for the installed SGLang release (raises `SglangUnavailable`): its
    `MambaRadixCache` in that release's API era, or with `tree_core` (or where no
    `MambaRadixCache` ships) its `UnifiedRadixCache` on that core (or both, `parity`)."""
    from harness.caches.sglang_loader import sglang_version
    from harness.caches.sglang_releases import has_tree_cores, mamba_era, serves_unified, ships_mamba_radix_cache

    version = sglang_version()
    if tree_core is None and not ships_mamba_radix_cache(version):
        tree_core = "python"
    if tree_core is not None:
        if not serves_unified(version):
            raise ValueError(f"--impl sglang-{tree_core}: SGLang {version}'s scheduler builds no UnifiedRadixCache "
                             f"for hybrid Mamba models (it does from 0.5.16)")
        if tree_core != "python" and not has_tree_cores(version):
            raise ValueError(f"--impl sglang-{tree_core}: SGLang {version}'s unified tree has no tree cores "
                             f"to pick from (0.5.19 on); only sglang-python")
        from harness.caches.sglang_unified_eras import unified_factory

        return unified_factory(version, tree_core)
    module, name = MAMBA_ERA_ADAPTERS[mamba_era(version)]
    return getattr(importlib.import_module(module), name)


def sglang_caches() -> List[str]:
    """Every cache of the installed SGLang release the harness drives, as `--impl` names
    (`harness.caches.sglang_releases.caches_of`)."""
    from harness.caches.sglang_loader import sglang_version
    from harness.caches.sglang_releases import caches_of

    return list(caches_of(sglang_version()))


def cache_factory(name: str) -> CacheFactory:
    """`impl`, `sglang` (when installed) or `MODULE:CLASS`, a subclass of `impl`'s
    `MambaRadixCache`. Raises `ValueError` naming the argument when it cannot be loaded."""
    if name == "impl":
        return ImplCache
    if name == "sglang" or (name.startswith("sglang-") and name[len("sglang-") :] in TREE_CORES):
        from harness.caches.sglang_loader import sglang_unavailable

        reason = sglang_unavailable()
        if reason:
            raise ValueError(f"--impl {name}: {reason}")
        return sglang_cache_class(name[len("sglang-") :] if name != "sglang" else None)
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--impl must be 'impl', 'sglang', 'sglang-CORE' or MODULE:CLASS, got {name!r}")
    try:
        cache_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--impl {name}: cannot load it ({exc})") from None
    if not (isinstance(cache_class, type) and issubclass(cache_class, MambaRadixCache)):
        raise ValueError(f"--impl {name}: {cache_class!r} is not a subclass of impl's MambaRadixCache")
    return functools.partial(ImplCache, cache_class=cache_class)


def cache_class(factory: CacheFactory) -> type:
    """The `CacheUnderTest` class a factory builds (a `MODULE:CLASS` factory is a partial of
    `ImplCache`, a tree core's a partial of its class), for what the class says without
    building a cache."""
    return factory.func if isinstance(factory, functools.partial) else factory


def cache_release(factory: CacheFactory) -> str:
    """The version of the code a factory's caches run (impl's, or the installed SGLang's)."""
    cls = cache_class(factory)
    if cls.name.startswith("sglang"):
        from harness.caches.sglang_loader import sglang_version

        return sglang_version()
    return cls.release


def default_protocol(factory: CacheFactory) -> str:
    """The scheduler protocol a factory's caches run under unless told otherwise
    (`CacheUnderTest.release_protocol`; both tree cores side by side, `parity`, take their
    release's hand-written calls: no scheduler drives two trees)."""
    if isinstance(factory, functools.partial) and factory.keywords.get("tree_core") == "parity":
        return factory.keywords["cache_class"].default_protocol
    return cache_class(factory).release_protocol(cache_release(factory))


def cache_name(factory: CacheFactory) -> str:
    """The name a factory's caches go by (`impl`, `sglang`, `sglang-rust`), without building one."""
    if isinstance(factory, functools.partial) and "tree_core" in factory.keywords:
        return f"sglang-{factory.keywords['tree_core']}"
    if isinstance(factory, functools.partial) and "cache_class" in factory.keywords:
        return class_impl_name(factory.keywords["cache_class"])
    return cache_class(factory).name


__all__ = ["CacheFactory", "CacheUnderTest", "ImplCache", "cache_class", "cache_factory", "cache_name", "cache_release", "default_protocol", "TREE_CORES", "impl_name", "sglang_cache_class", "sglang_caches"]
