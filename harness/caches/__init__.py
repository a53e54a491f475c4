"""The caches under test, one module per cache family and API era.

  impl            this repository's `impl` (`harness.caches.impl`)
  sglang          SGLang's own `MambaRadixCache` and pools, for the installed release:
                  0.5.4's API (`harness.caches.sglang_0_5_4`) or 0.5.20's (`sglang_0_5_20`)
  MODULE:CLASS    a subclass of `impl.MambaRadixCache` (a planted bug, a patched cache)

`cache_factory(name)` gives a callable building the cache from a `CacheConfig`.
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

from impl import MambaRadixCache
from harness.caches.base import CacheUnderTest
from harness.caches.impl import ImplCache
from strategies.config import CacheConfig

CacheFactory = Callable[[CacheConfig], CacheUnderTest]


def sglang_cache_class() -> type:
    """The cache class for the installed SGLang release (raises `SglangUnavailable`)."""
    from harness.caches.sglang_loader import sglang_version

    if sglang_version() == "0.5.4":
        from harness.caches.sglang_0_5_4 import Sglang054Cache

        return Sglang054Cache
    from harness.caches.sglang_0_5_20 import Sglang0520Cache

    return Sglang0520Cache


def cache_factory(name: str) -> CacheFactory:
    """`impl`, `sglang` (when installed) or `MODULE:CLASS`, a subclass of `impl`'s
    `MambaRadixCache`. Raises `ValueError` naming the argument when it cannot be loaded."""
    if name == "impl":
        return ImplCache
    if name == "sglang":
        from harness.caches.sglang_loader import sglang_unavailable

        reason = sglang_unavailable()
        if reason:
            raise ValueError(f"--impl sglang: {reason}")
        return sglang_cache_class()
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--impl must be 'impl', 'sglang' or MODULE:CLASS, got {name!r}")
    try:
        cache_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--impl {name}: cannot load it ({exc})") from None
    if not (isinstance(cache_class, type) and issubclass(cache_class, MambaRadixCache)):
        raise ValueError(f"--impl {name}: {cache_class!r} is not a subclass of impl's MambaRadixCache")
    return functools.partial(ImplCache, cache_class=cache_class)


def cache_class(factory: CacheFactory) -> type:
    """The `CacheUnderTest` class a factory builds (a `MODULE:CLASS` factory is a partial of
    `ImplCache`), for what the class says without building a cache."""
    return factory.func if isinstance(factory, functools.partial) else factory


def cache_release(factory: CacheFactory) -> str:
    """The version of the code a factory's caches run (impl's, or the installed SGLang's)."""
    cls = cache_class(factory)
    if cls.name == "sglang":
        from harness.caches.sglang_loader import sglang_version

        return sglang_version()
    return cls.release


def cache_name(factory: CacheFactory) -> str:
    """The name a factory's caches go by (`impl`, `sglang`), without building one."""
    return cache_class(factory).name


__all__ = ["CacheFactory", "CacheUnderTest", "ImplCache", "cache_class", "cache_factory", "cache_name", "cache_release", "sglang_cache_class"]
