"""Scenarios: pool sizes, server settings, request shapes and operation weights for one
configuration of the harness.

A scenario draws the pools the cache is built with (`pool_config`) and the scheduler's server
settings (`scheduler_config`), and weights the operations the chooser picks from (weights are
relative; 0 disables one). Tiny pools put eviction, refusals and retraction on most steps; roomy
ones grow deep trees. Pools are sized as SGLang's model runner sizes them for a hybrid model
with the radix cache on: the request pool holds at most a third of the Mamba pool's slots
(`MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`). A tiny KV pool now and then gets a prompt too
long for it (the scheduler aborts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, Dict, Hashable, Mapping, Sequence, Tuple

from hypothesis import strategies as st

from strategies.config import NO_BUFFER, CacheConfig, SchedulerConfig, Serving, chunk_sizes_for, track_intervals_for, tracking_slots_of

Integer = Callable[[int, int], int]

MAMBA_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (0.5.23: mem_cache/kv_cache_configurator.py)

OPERATIONS: Tuple[str, ...] = (
    "arrive",
    "iterate",
    "abort",
    "flush",
    "insert",
    "match",
    "lock",
    "unlock",
    "unlock_unlocked",
    "lock_evicted",
    "evict",
    "evict_mamba",
    "cow_match",
    "req_slots",
)

DEFAULT_MIX: Mapping[str, int] = {
    "arrive": 6,
    "iterate": 12,
    "abort": 1,
    "flush": 1,
    "insert": 2,
    "match": 1,
    "lock": 1,
    "unlock": 1,
    "unlock_unlocked": 1,
    "lock_evicted": 1,
    "evict": 1,
    "evict_mamba": 1,
    "cow_match": 1,
    "req_slots": 1,
}


def pool_config(
    integer: Integer, kv: Tuple[int, int], mamba: Tuple[int, int], req: Tuple[int, int], device: str = "cpu",
    servings: Tuple[Serving, ...] = (NO_BUFFER,),
) -> CacheConfig:
    """A cache configuration with sizes from the given inclusive ranges (`integer(lo, hi)` picks)
    and one of `servings` (its server settings), the Mamba pool holding `MAMBA_PER_REQUEST`
    slots per request slot at least, and the track slots of each with the extra buffer (the
    model runner's `_calculate_mamba_ratio`; the Mamba range's ends are raised to that where
    they fall short)."""
    if req[0] * MAMBA_PER_REQUEST > mamba[0]:
        raise ValueError(f"request pool sizes {req} must allow one no larger than a third of the Mamba pool {mamba}")
    settings = dict(servings[integer(0, len(servings) - 1)] if len(servings) > 1 else servings[0])
    per_request = mamba_per_request(settings["mamba_strategy"], settings["event_loop"])
    least = req[0] * per_request
    kv_size, mamba_size = integer(*kv), integer(max(mamba[0], least), max(mamba[1], least))
    req_size = integer(req[0], min(req[1], mamba_size // per_request))
    return CacheConfig(
        kv_size=paged_pool(kv_size, settings["page_size"], req_size), mamba_size=mamba_size, req_size=req_size,
        max_context_len=128, device=device, **settings
    )


def paged_pool(kv_size: int, page_size: int, req_size: int) -> int:
    """A KV pool of `kv_size` slots as whole pages: rounded up, and at least two pages a request
    slot (a request's last page is its own, however few of its slots it fills)."""
    pages = max(-(-kv_size // page_size), 2 * req_size if page_size > 1 else 1)
    return pages * page_size


def mamba_per_request(mamba_strategy: str, event_loop: str = "normal") -> int:
    """The Mamba slots the model runner sizes its pool with per request slot under these server
    settings: `MAMBA_PER_REQUEST`, and the request's track slots (0.5.23's
    `_calculate_mamba_ratio`)."""
    return MAMBA_PER_REQUEST + tracking_slots_of(mamba_strategy, event_loop)


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
    """One configuration of the harness."""

    name: str
    kv: Tuple[int, int]
    mamba: Tuple[int, int]
    req: Tuple[int, int]
    vocab: int = 4
    max_len: int = 12
    max_chunk: int = 6  # the largest chunked_prefill_size drawn
    max_new: int = 12  # the largest max_new_tokens a request asks for (large ones bring retraction)
    extra_keys: Tuple[Hashable, ...] = (None,)
    disaggregation: Tuple[str, ...] = ("null",)
    conservativeness: Tuple[float, ...] = (1.0, 0.3, 1.5)  # 0.3: decode memory reserved thinly
    eos_odds: int = 4  # the forward pass samples the eos token about once in eos_odds * vocab tokens
    min_running: int = 1  # the fewest max_running_requests drawn (at most the request pool's size)
    # the server settings drawn (weighted: repeated), `--mamba-strategy` and `--event-loop` pin them
    servings: Tuple[Serving, ...] = (NO_BUFFER,)
    track_intervals: Tuple[int, ...] = (4, 8)  # with the extra buffer: decode checkpoints every this many tokens
    mix: Dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MIX))

    @property
    def eos(self) -> int:
        """The eos token: one past the prompt vocabulary, so only the forward pass samples it."""
        return self.vocab

    def config(self, integer: Integer, device: str = "cpu") -> CacheConfig:
        return pool_config(integer, self.kv, self.mamba, self.req, device, self.servings)

    def scheduler(self, integer: Integer, config: CacheConfig) -> SchedulerConfig:
        """Server settings for one program: chunked prefill on or off, the prefill budget, how
        many requests run at once, the policy, how conservatively decode memory is reserved."""
        chunks = chunk_sizes_for(config.page_size, tuple(c if c >= 2 else None for c in range(self.max_chunk + 1)))
        intervals = track_intervals_for(config.page_size, self.track_intervals)
        return SchedulerConfig(
            chunked_prefill_size=chunks[integer(0, len(chunks) - 1)],
            max_prefill_tokens=(self.max_len, 4 * self.max_len, 16384)[integer(0, 2)],
            max_running_requests=integer(min(self.min_running, config.req_size), config.req_size),
            schedule_policy=("fcfs", "lpm")[integer(0, 1)],
            schedule_conservativeness=self.conservativeness[integer(0, len(self.conservativeness) - 1)],
            disaggregation_mode=self.disaggregation[integer(0, len(self.disaggregation) - 1)],
            eos_token_id=self.eos,
            **({"mamba_track_interval": intervals[integer(0, len(intervals) - 1)]}
               if config.mamba_strategy != "no_buffer" else {}),
        )

    def weighted(self, **weights: int) -> "Scenario":
        """The same scenario with some operation weights changed."""
        unknown = set(weights) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; known: {list(OPERATIONS)}")
        return replace(self, mix={**self.mix, **weights})


TINY = Scenario("tiny", kv=(12, 26), mamba=(3, 7), req=(1, 2), vocab=3, max_len=8, max_chunk=4)
MEDIUM = Scenario("medium", kv=(24, 64), mamba=(6, 12), req=(2, 4))
LARGE = Scenario("large", kv=(128, 320), mamba=(24, 48), req=(4, 8), vocab=5, max_len=20, max_chunk=8, max_new=40)
CHUNKED = Scenario("chunked", kv=(24, 64), mamba=(6, 12), req=(2, 4), max_len=16, max_chunk=4).weighted(arrive=8, iterate=16)
LOCK_HEAVY = Scenario("lock_heavy", kv=(20, 48), mamba=(3, 9), req=(1, 3)).weighted(
    lock=5, unlock=3, unlock_unlocked=3, lock_evicted=2, evict=4, evict_mamba=4, insert=4, cow_match=4
)
EXTRA_KEYS = Scenario("extra_keys", kv=(24, 64), mamba=(6, 12), req=(2, 4), extra_keys=(None, "lora-a", "lora-b"))
# several requests decoding at once on a KV pool that cannot hold all they may generate, with
# decode memory reserved very thinly and eos rare: retraction on most programs that run long
DECODE_PRESSURE = Scenario(
    "decode_pressure", kv=(10, 24), mamba=(9, 14), req=(3, 4), max_len=4, max_new=16, conservativeness=(0.1,),
    eos_odds=16, min_running=2,
).weighted(arrive=10, iterate=30)
DISAGG_PREFILL = Scenario(
    "disagg_prefill", kv=(24, 64), mamba=(6, 12), req=(2, 4), max_len=14, max_chunk=4, disaggregation=("prefill",)
).weighted(abort=3)

SCENARIOS: Dict[str, Scenario] = {
    s.name: s for s in (TINY, MEDIUM, LARGE, CHUNKED, LOCK_HEAVY, EXTRA_KEYS, DECODE_PRESSURE, DISAGG_PREFILL)
}
