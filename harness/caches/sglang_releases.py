"""Every SGLang release with a hybrid Mamba prefix cache, and what each one ships and serves.

SGLang shipped `MambaRadixCache` from 0.5.3.post2 to 0.5.20 and built it for hybrid Mamba models
up to 0.5.15.post1; from 0.5.16 its scheduler builds `UnifiedRadixCache` (components FULL + MAMBA,
`mem_cache/registry.py`) instead, and 0.5.21 deleted `MambaRadixCache`. The unified tree grew two
interchangeable cores in 0.5.19 (`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`, default `python`), and
the Rust core became the default in 0.5.21. (0.5.11 to 0.5.15.post1 ship a `UnifiedRadixCache`
that the scheduler builds for Mamba models only behind an experimental switch; it is not served.)

The API eras of `MambaRadixCache` and its pools, read from the wheels (each era's adapter is named
in `harness.caches.sglang_cache_class`):
  kwargs          0.5.3.post2 .. 0.5.5.post3   keyword constructor, `match_prefix(key)`,
                                               `insert(key, value, mamba_value)`, `evict(n)`,
                                               Mamba slots from `MambaPool` (`fork_from`)
  init-params     0.5.6 .. 0.5.8.post1         `MambaRadixCache(CacheInitParams)`; from 0.5.7 the
                                               request pool takes the extra-buffer arguments and
                                               `alloc(n, reqs)`; from 0.5.8 `match_prefix` takes
                                               `MatchPrefixParams`
  params          0.5.9 .. 0.5.12.post1        `InsertParams` / `EvictParams`, request pool
                                               `alloc(reqs)` / `free(req)` / `free_mamba_cache(req)`
  mamba-allocator 0.5.13 .. 0.5.18             Mamba slots from `req_to_token_pool.mamba_allocator`,
                                               copy-on-write deferred to the forward pass; from 0.5.16
                                               `cache_finished_req(..., kv_len_to_handle)`
  req-kv          0.5.19 .. 0.5.20             a request's slots in `req.kv` (`ReqKvInfo`)
"""

from __future__ import annotations

from typing import Dict, Tuple

from dataclasses import replace

from packaging.version import Version

from reference import SGLANG_0_5_4, SGLANG_UNIFIED_0_5_20, Rules

# every PyPI release from the first with MambaRadixCache to the newest, oldest first
RELEASES: Tuple[str, ...] = (
    "0.5.3.post2", "0.5.3.post3",
    "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3",
    "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3",
    "0.5.6", "0.5.6.post1", "0.5.6.post2",
    "0.5.7",
    "0.5.8", "0.5.8.post1",
    "0.5.9",
    "0.5.10rc0", "0.5.10", "0.5.10.post1",
    "0.5.11",
    "0.5.12", "0.5.12.post1",
    "0.5.13", "0.5.13.post1",
    "0.5.14",
    "0.5.15", "0.5.15.post1",
    "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip

MAMBA_ERAS: Dict[str, Tuple[str, str]] = {
    "kwargs": ("0.5.3.post2", "0.5.5.post3"),
    "init-params": ("0.5.6", "0.5.8.post1"),
    "params": ("0.5.9", "0.5.12.post1"),
    "mamba-allocator": ("0.5.13", "0.5.18"),
    "req-kv": ("0.5.19", "0.5.20"),
}


# where `MambaRadixCache`'s deliberate behaviour changed, read from the wheels: (first release,
# `reference.Rules` switch, its value from then on); 0.5.4's rules hold before the first change
MAMBA_RULE_CHANGES: Tuple[Tuple[str, str, object], ...] = (
    ("0.5.4.post3", "insert_refreshes_end_node", True),  # insert's last branch: full_lru reset
    ("0.5.9", "first_mamba_slot", 1),  # MambaPool slots from arange(1, size + 1)
    ("0.5.10rc0", "insert_frees_duplicate_kv", True),  # _insert_helper(prev_prefix_len) frees them
    ("0.5.11", "first_req_slot", 1),  # ReqToTokenPool slots from range(1, size + 1)
    ("0.5.16", "match_refreshes_mamba_path", False),  # match: only the matched node's state
    ("0.5.16", "insert_refreshes_mamba", False),  # insert: only states new to the tree
    ("0.5.16", "split_refreshes_mamba", False),  # _split_node leaves the Mamba list
    ("0.5.18", "req_slots_from_tail", True),  # ReqToTokenPool.alloc takes free_slots[-n:]
)


def mamba_radix_cache_rules(version: str) -> Rules:
    """The model's rules for `MambaRadixCache` in release `version` (0.5.4's, changed as
    `MAMBA_RULE_CHANGES` says)."""
    changes = {switch: value for first, switch, value in MAMBA_RULE_CHANGES if _v(first) <= _v(version)}
    return replace(SGLANG_0_5_4, name=version, **changes)


# the same for `UnifiedRadixCache` (Full + Mamba) from 0.5.16, whose rules start as 0.5.20's with
# the differences below undone
UNIFIED_RULE_CHANGES: Tuple[Tuple[str, str, object], ...] = (
    ("0.5.16", "split_refreshes_mamba", True),  # _split_node: remove_node, then insert_mru
    ("0.5.16", "req_slots_from_tail", False),
    ("0.5.16", "finishing_frees_past_key_first", True),  # cache_finished_req frees kv[effective_cache_len:] first
    ("0.5.17", "finishing_frees_past_key_first", False),  # cache_finished_req frees the tail after the insert (`tail_free_start`)
    ("0.5.18", "req_slots_from_tail", True),  # ReqToTokenPool.alloc takes free_slots[-n:]
    ("0.5.20", "split_refreshes_mamba", False),  # _split_node: insert_after(child, node)
    ("0.5.22", "finishing_rematches", True),  # checkpoint_into_tree matches again, finished or not
    ("0.5.23", "caching_rematches", False),  # checkpoint repoints to the insert's own node
    ("0.5.23", "finishing_rematches", False),
)


def unified_rules(version: str) -> Rules:
    """The model's rules for `UnifiedRadixCache` in release `version` (0.5.16 on)."""
    changes = {switch: value for first, switch, value in UNIFIED_RULE_CHANGES if _v(first) <= _v(version)}
    return replace(SGLANG_UNIFIED_0_5_20, name=f"unified-{version}", **changes)


def _v(version: str) -> Version:
    return Version(version)


def _within(version: str, first: str, last: str) -> bool:
    """Whether `version` is from `first` to `last`; a range up to the newest release takes in the
    versions after it (a development version is treated as the newest release)."""
    return _v(first) <= _v(version) and (last == RELEASES[-1] or _v(version) <= _v(last))


def known_release(version: str) -> bool:
    """Whether `version` is one of `RELEASES`."""
    return version in RELEASES


def is_development(version: str) -> bool:
    """Whether `version` is newer than every release the harness knows: a checkout's development
    version (`0.5.24.dev0`) or a release newer than `RELEASES`. The newest release's adapter,
    protocol and rules drive it (`harness.caches.sglang_api` checks its API first)."""
    try:
        return _v(version) > _v(RELEASES[-1])
    except ValueError:
        return False


def release_range(first: str, last: str) -> Tuple[str, ...]:
    """The releases from `first` to `last` (both included; either may fall between releases);
    ValueError for a version that does not parse."""
    for bound in (first, last):
        try:
            _v(bound)
        except ValueError:
            raise ValueError(f"not a release version: {bound!r}") from None
    return tuple(r for r in RELEASES if _within(r, first, last))


def ships_mamba_radix_cache(version: str) -> bool:
    return _within(version, "0.5.3.post2", "0.5.20")


def serves_unified(version: str) -> bool:
    """Whether the release's scheduler builds `UnifiedRadixCache` for hybrid Mamba models."""
    return _within(version, "0.5.16", RELEASES[-1])


def has_tree_cores(version: str) -> bool:
    """Whether the unified tree has the Python and the Rust core to pick from."""
    return _within(version, "0.5.19", RELEASES[-1])


def default_tree_core(version: str) -> str:
    return "rust" if _within(version, "0.5.21", RELEASES[-1]) else "python"


def mamba_era(version: str) -> str:
    """The API era of the release's `MambaRadixCache` (see the module docstring)."""
    for era, (first, last) in MAMBA_ERAS.items():
        if _within(version, first, last):
            return era
    raise ValueError(f"SGLang {version} ships no MambaRadixCache")


def served_cache(version: str) -> str:
    """The `--impl` name of the cache the release's scheduler builds for a hybrid Mamba model."""
    return f"sglang-{default_tree_core(version)}" if serves_unified(version) else "sglang"


def caches_of(version: str) -> Tuple[str, ...]:
    """Every cache of the release the harness drives, as `--impl` names: the one its scheduler
    serves first, then `MambaRadixCache` where it still ships beside the unified cache, then the
    other tree core."""
    names = [served_cache(version)]
    if serves_unified(version) and ships_mamba_radix_cache(version):
        names.append("sglang")
    if has_tree_cores(version):
        names += [f"sglang-{core}" for core in ("python", "rust") if f"sglang-{core}" not in names]
    return tuple(names)
