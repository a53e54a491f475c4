"""The SGLang calls the newest era's adapter makes, checked against a development version.

A development version of SGLang (an editable install of a checkout: `0.5.24.dev0`, or any version
newer than the newest release the harness knows) is driven by the newest era's adapter and rules
(`harness.caches.sglang_releases.is_development`). Before it is, `check_api` reads the signature of
every call that adapter makes (`NEWEST_ERA_CALLS`, as of the newest release) and refuses, naming
the call, where the checkout's API moved: a call gone, a parameter the adapter passes gone, or a
new parameter without a default.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Optional, Tuple

# (module, attribute path, the parameters the adapter passes by name, or positionally: "*2" for
# two positional arguments after self); a class's path means its constructor
NEWEST_ERA_CALLS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("sglang.srt.mem_cache.memory_pool", "HybridReqToTokenPool",
     ("size", "mamba_size", "max_context_len", "device", "enable_memory_saver", "cache_params",
      "speculative_num_draft_tokens", "mamba_spec_state_size", "enable_mamba_extra_buffer", "mamba_layer_ids",
      "enable_overlap_schedule")),
    ("sglang.srt.mem_cache.allocator", "TokenToKVPoolAllocator", ("size", "dtype", "device", "kvcache", "need_sort")),
    ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams",
     ("disable", "req_to_token_pool", "token_to_kv_pool_allocator", "page_size", "tree_components")),
    ("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams", ("key", "cow_mamba", "req")),
    ("sglang.srt.mem_cache.base_prefix_cache", "EvictParams", ("num_tokens", "mamba_num")),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache", ("*1",)),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.match_prefix", ("*1",)),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.evict_for_alloc", ("*1",)),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.lock", ("*1",)),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.unlock", ("*1",)),
    ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache.reset", ()),
    ("sglang.srt.mem_cache.common", "checkpoint_kv_cache", ("*2",)),
    ("sglang.srt.mem_cache.common", "release_kv_cache", ("*2", "checkpoint")),
    ("sglang.srt.managers.schedule_batch", "Req", ("*4", "extra_key")),
    ("sglang.srt.sampling.sampling_params", "SamplingParams", ("max_new_tokens",)),
    ("sglang.srt.mem_cache.radix_cache", "RadixKey", ("*2",)),
)


def check_api(version: str, newest: str) -> Optional[str]:
    """Why the adapter of release `newest` cannot drive SGLang `version`: one line naming the
    first call whose signature changed; None when every call fits."""
    for module, path, passed in NEWEST_ERA_CALLS:
        name = f"{module}.{path}"
        try:
            target = importlib.import_module(module)
            for part in path.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            return f"SGLang {version}: {name} is gone ({exc}); the harness's adapter makes the calls of {newest}"
        problem = _mismatch(target, passed)
        if problem:
            return f"SGLang {version}: the signature of {name} changed since {newest}: {problem}; the harness's adapter makes {newest}'s calls"
    return None


def _mismatch(target: object, passed: Tuple[str, ...]) -> Optional[str]:
    try:
        signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    except (TypeError, ValueError):
        return None  # a builtin without a readable signature: nothing to compare
    params = [p for p in signature.parameters.values() if p.name != "self"]
    kinds = inspect.Parameter
    positional = sum(int(p[1:]) for p in passed if p.startswith("*"))
    named = [p for p in passed if not p.startswith("*")]
    takes_any_keyword = any(p.kind == kinds.VAR_KEYWORD for p in params)
    takes_any_positional = any(p.kind == kinds.VAR_POSITIONAL for p in params)
    by_position = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    if positional > len(by_position) and not takes_any_positional:
        return f"it takes {len(by_position)} positional argument(s), the adapter passes {positional}"
    names = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    gone = [n for n in named if n not in names and not takes_any_keyword]
    if gone:
        return f"no parameter {gone[0]!r}"
    filled = {p.name for p in by_position[:positional]} | set(named)
    required = [
        p.name for p in params
        if p.default is kinds.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) and p.name not in filled
    ]
    if required:
        return f"a new parameter without a default, {required[0]!r}"
    return None
