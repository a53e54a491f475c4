"""Which adapter drives SGLang's `UnifiedRadixCache` of a release: one module per API era, each a
thin override of the shared base (`harness.caches.sglang_unified`)."""

from __future__ import annotations

import functools
from typing import Any

from packaging.version import Version

from harness.caches.parity import ParityCache
from harness.caches.sglang_unified_0_5_16 import SglangUnified0516Cache
from harness.caches.sglang_unified_0_5_17 import SglangUnified0517Cache
from harness.caches.sglang_unified_0_5_20 import SglangUnified0520Cache
from harness.caches.sglang_unified_0_5_22 import SglangUnified0522Cache


def unified_class(version: str) -> type:
    """The adapter of SGLang `version`'s era."""
    if Version(version) <= Version("0.5.16"):  # no tree core yet: the cache holds the nodes
        return SglangUnified0516Cache
    if Version(version) <= Version("0.5.18"):  # 0.5.17, 0.5.18: 0.5.20's calls, flat requests
        return SglangUnified0517Cache
    if Version(version) <= Version("0.5.21"):  # 0.5.19 .. 0.5.21: 0.5.20's calls
        return SglangUnified0520Cache
    return SglangUnified0522Cache


def unified_factory(version: str, tree_core: str) -> Any:
    """A factory of the `UnifiedRadixCache`s of SGLang `version` on `tree_core` (`parity`: the
    Python and the Rust core side by side, `harness.caches.parity`)."""
    cls = unified_class(version)
    if tree_core == "parity":
        return functools.partial(ParityCache, tree_core=tree_core, cache_class=cls)
    return functools.partial(cls, tree_core=tree_core)

