"""Scenarios: pool sizes, request shapes and operation weights for one state-machine configuration.

A scenario's `pools` strategy draws the sizes the cache is built with; `mix` weights the
operations the machine's step rule picks from (weights are relative; 0 disables an operation).
Tiny pools put eviction and allocation failure on most steps; roomy ones grow deep trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Dict, Hashable, Mapping, Sequence, Tuple

from hypothesis import strategies as st

from harness.config import CacheConfig

OPERATIONS: Tuple[str, ...] = (
    "start_request",
    "admit",
    "rematch",
    "prefill_chunk",
    "decode",
    "finish",
    "abort",
    "evict",
    "evict_mamba",
    "insert",
    "match",
    "lock",
    "unlock",
    "unlock_unlocked",
    "lock_evicted",
)

DEFAULT_MIX: Mapping[str, int] = {
    "start_request": 6,
    "admit": 5,
    "rematch": 2,
    "prefill_chunk": 5,
    "decode": 5,
    "finish": 4,
    "abort": 1,
    "evict": 2,
    "evict_mamba": 2,
    "insert": 3,
    "match": 2,
    "lock": 1,
    "unlock": 1,
    "unlock_unlocked": 1,
    "lock_evicted": 1,
}


def pool_config(integer, kv: Tuple[int, int], mamba: Tuple[int, int], req: Tuple[int, int], device: str = "cpu") -> CacheConfig:
    """A cache configuration with sizes from the given inclusive ranges (`integer(lo, hi)` picks).

    The request pool is never larger than the Mamba pool: every running request holds a Mamba
    slot, and SGLang sizes its pools so (its request-to-Mamba map has one entry per Mamba slot).
    """
    if req[0] > mamba[0]:
        raise ValueError(f"request pool sizes {req} must allow one no larger than the Mamba pool {mamba}")
    kv_size, mamba_size = integer(*kv), integer(*mamba)
    req_size = integer(req[0], min(req[1], mamba_size))
    return CacheConfig(kv_size=kv_size, mamba_size=mamba_size, req_size=req_size, max_context_len=128, device=device)


def pool_configs(
    kv: Tuple[int, int], mamba: Tuple[int, int], req: Tuple[int, int], device: str = "cpu"
) -> st.SearchStrategy[CacheConfig]:
    """Hypothesis strategy for `pool_config`."""
    return st.composite(lambda draw: pool_config(lambda lo, hi: draw(st.integers(lo, hi)), kv, mamba, req, device))()


def weighted_operations(mix: Mapping[str, int], applicable: Sequence[str]) -> Tuple[str, ...]:
    """The operations among `applicable`, each repeated by its weight: a uniform pick from this
    tuple picks with the mix's relative weights."""
    weighted = tuple(op for op in OPERATIONS if op in applicable for _ in range(mix.get(op, 0)))
    if not weighted:
        raise ValueError(f"no applicable operation has a positive weight: {list(applicable)}")
    return weighted


@lru_cache(maxsize=4096)
def choices(options: Tuple) -> st.SearchStrategy:
    """`sampled_from(options)`, built once per distinct tuple (strategies are drawn every step)."""
    return st.sampled_from(options)


@dataclass(frozen=True)
class Scenario:
    """One state-machine configuration."""

    name: str
    kv: Tuple[int, int]
    mamba: Tuple[int, int]
    req: Tuple[int, int]
    vocab: int = 4
    max_len: int = 12
    max_chunk: int = 6
    extra_keys: Tuple[Hashable, ...] = (None,)
    mix: Dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MIX))

    def pools(self, device: str = "cpu") -> st.SearchStrategy[CacheConfig]:
        return pool_configs(self.kv, self.mamba, self.req, device)

    def config(self, integer, device: str = "cpu") -> CacheConfig:
        return pool_config(integer, self.kv, self.mamba, self.req, device)

    def weighted(self, **weights: int) -> "Scenario":
        """The same scenario with some operation weights changed."""
        unknown = set(weights) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; known: {list(OPERATIONS)}")
        return replace(self, mix={**self.mix, **weights})


TINY = Scenario("tiny", kv=(6, 16), mamba=(2, 4), req=(1, 3), vocab=3, max_len=8, max_chunk=4)
MEDIUM = Scenario("medium", kv=(24, 64), mamba=(4, 10), req=(2, 4))
LARGE = Scenario("large", kv=(128, 320), mamba=(16, 48), req=(4, 8), vocab=5, max_len=20, max_chunk=8)
CHUNKED = Scenario("chunked", kv=(24, 64), mamba=(3, 8), req=(2, 4), max_len=16, max_chunk=3).weighted(
    prefill_chunk=12, admit=6, decode=3, insert=1
)
LOCK_HEAVY = Scenario("lock_heavy", kv=(16, 48), mamba=(3, 8), req=(2, 4)).weighted(
    lock=5, unlock=3, unlock_unlocked=3, lock_evicted=2, evict=4, evict_mamba=4
)
EXTRA_KEYS = Scenario("extra_keys", kv=(24, 64), mamba=(4, 10), req=(2, 4), extra_keys=(None, "lora-a", "lora-b"))

SCENARIOS: Dict[str, Scenario] = {
    s.name: s for s in (TINY, MEDIUM, LARGE, CHUNKED, LOCK_HEAVY, EXTRA_KEYS)
}
