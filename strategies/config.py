"""What one harness run builds and runs with: the pools (`CacheConfig`) and the scheduler's server
settings (`SchedulerConfig`). Both are plain frozen data: strategies draw them, traces record them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

POLICIES = ("fcfs", "lpm")
DISAGGREGATION_MODES = ("null", "prefill")
# `--mamba-radix-cache-strategy`: the request's running state alone, or with track slots the
# forward pass checkpoints into (the extra buffer; the lazy variant is not drawn yet)
MAMBA_STRATEGIES = ("no_buffer", "extra_buffer")
# the scheduler's event loop: `event_loop_normal` (`--disable-overlap-schedule`) or
# `event_loop_overlap`, which launches a batch before it processes the one before's results
EVENT_LOOPS = ("normal", "overlap")
# `--page-size`: KV slots per page, the unit the allocator hands out and the tree's keys are cut
# to (0.5.23's `PagedTokenToKVPoolAllocator` past 1; `no_buffer` takes only 1)
PAGE_SIZES = (1, 4, 16, 64)


def tracking_slots_of(strategy: str, event_loop: str = "normal") -> int:
    """Track slots per request beside its running state (0.5.23's
    `allocation_sizing.get_mamba_tracking_slots`): with the extra buffer one under the normal
    event loop, a ping-pong pair under the overlap loop (whose forward pass writes one while the
    tree may still take the other); none without it."""
    if strategy != "extra_buffer":
        return 0
    return 2 if event_loop == "overlap" else 1


# the server settings that shape the pools and the scheduler's Mamba bookkeeping, each a
# `CacheConfig` field: what a line calls them, and the values SGLang has
SERVER_SETTINGS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "mamba_strategy": ("Mamba strategies", MAMBA_STRATEGIES),
    "event_loop": ("event loops", EVENT_LOOPS),
    "page_size": ("page sizes", PAGE_SIZES),
}
Setting = Union[str, int]  # a value of one of them
# one combination of them: (field, value) pairs in `SERVER_SETTINGS`' order
Serving = Tuple[Tuple[str, Setting], ...]


def serving(mamba_strategy: str = "no_buffer", event_loop: str = "normal", page_size: int = 1) -> Serving:
    """The combination of server settings named."""
    return (("mamba_strategy", mamba_strategy), ("event_loop", event_loop), ("page_size", page_size))


# the combinations SGLang's server-args validation lets through (0.5.16 .. 0.5.23
# `mamba_hook.validate_mamba_no_buffer`: no_buffer forces the normal loop and page size 1), with
# the weights a fuzz draws them with: what SGLang serves by default (the extra buffer under the
# overlap loop, page size 1 on the triton backend) most often, pages of 4 and 16 tokens beside it
# (64, the size paged attention backends pick, only pinned: the configurations' prompts fit in a
# page of it)
SERVINGS: Tuple[Tuple[Serving, int], ...] = (
    (serving("extra_buffer", "overlap"), 3),
    (serving("extra_buffer", "overlap", 4), 2),
    (serving("extra_buffer", "overlap", 16), 1),
    (serving("extra_buffer", "overlap", 64), 0),
    (serving("extra_buffer", "normal"), 1),
    (serving("extra_buffer", "normal", 4), 1),
    (serving("extra_buffer", "normal", 16), 0),
    (serving("extra_buffer", "normal", 64), 0),
    (serving("no_buffer", "normal"), 2),
)
NO_BUFFER = serving()


def setting_refusal(taken: Mapping[str, Tuple[Setting, ...]], settings: Mapping[str, Setting]) -> str:
    """Why `settings` (field -> value) fall outside `taken` (field -> the values taken; a field
    not named takes every value), as "<what> [...] only, not '<value>'"; "" when they do not."""
    for name, value in settings.items():
        values = taken.get(name, SERVER_SETTINGS[name][1])
        if value not in values:
            return f"{SERVER_SETTINGS[name][0]} {list(values)} only, not {value!r}"
    return ""


def servings_taken(takers: Sequence[Mapping[str, Tuple[Setting, ...]]], pinned: Mapping[str, Setting] = {}) -> Tuple[Serving, ...]:
    """The legal combinations (`SERVINGS`) every taker takes and that agree with `pinned`, each
    repeated by its weight (a uniform pick draws with the weights; a combination of weight 0 is
    drawn only where the pinned settings leave nothing heavier); empty when none is."""
    def taken(combination: Serving) -> bool:
        settings = dict(combination)
        return all(settings[k] == v for k, v in pinned.items()) and not any(setting_refusal(t, settings) for t in takers)

    legal = [(c, weight) for c, weight in SERVINGS if taken(c)]
    if legal and not any(weight for _, weight in legal):
        legal = [(c, 1) for c, _ in legal]
    return tuple(c for c, weight in legal for _ in range(weight))


def track_intervals_for(page_size: int, intervals: Sequence[int]) -> Tuple[int, ...]:
    """The `--mamba-track-interval`s among `intervals` SGLang takes with `page_size` (a multiple
    of the page, `mamba_hook.py`), or the page itself when none is."""
    return tuple(i for i in intervals if i % page_size == 0) or (page_size,)


def chunk_sizes_for(page_size: int, sizes: Sequence[Optional[int]]) -> Tuple[Optional[int], ...]:
    """The `--chunked-prefill-size`s among `sizes` SGLang takes with `page_size` (a multiple of
    the page, `validation_hook.py`; None: chunked prefill off)."""
    return tuple(c for c in sizes if c is None or c % page_size == 0)


def setting_flags(settings: Mapping[str, Setting]) -> str:
    """Server settings (field -> value) as the command line pins them."""
    return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in settings.items())


def legal_refusal(settings: Mapping[str, Setting]) -> str:
    """Why SGLang refuses the combination `settings` (some fields), "" when some legal
    combination agrees with them."""
    if any(all(dict(c)[k] == v for k, v in settings.items()) for c, _ in SERVINGS):
        return ""
    named = ", ".join(f"{k} {v!r}" for k, v in settings.items())
    return f"SGLang serves no {named} together (no_buffer forces the normal event loop and page size 1)"


def _positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Pool sizes, device and the server settings the pools are built for (SGLang's request pool
    takes `enable_overlap_schedule`; its KV allocator hands out pages of `page_size` slots, so the
    KV pool is whole pages) for a cache under test."""

    kv_size: int
    mamba_size: int
    req_size: int
    max_context_len: int = 256
    device: str = "cpu"
    page_size: int = 1
    mamba_strategy: str = "no_buffer"
    event_loop: str = "normal"

    def __post_init__(self):
        for name in ("kv_size", "mamba_size", "req_size", "max_context_len"):
            _positive_int("CacheConfig", name, getattr(self, name))
        if self.page_size not in PAGE_SIZES:
            raise ValueError(f"CacheConfig.page_size must be one of {PAGE_SIZES}, got {self.page_size!r}")
        if self.kv_size % self.page_size:
            raise ValueError(f"CacheConfig.kv_size must be whole pages of {self.page_size} slots, got {self.kv_size!r}")
        if self.mamba_strategy not in MAMBA_STRATEGIES:
            raise ValueError(f"CacheConfig.mamba_strategy must be one of {MAMBA_STRATEGIES}, got {self.mamba_strategy!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"CacheConfig.event_loop must be one of {EVENT_LOOPS}, got {self.event_loop!r}")
        illegal = legal_refusal(self.server_settings)
        if illegal:
            raise ValueError(f"CacheConfig: {illegal}")

    @property
    def server_settings(self) -> Dict[str, Setting]:
        """Its `SERVER_SETTINGS`: field -> value."""
        return {name: getattr(self, name) for name in SERVER_SETTINGS}

    @property
    def tracking_slots(self) -> int:
        """Track slots per request beside its running state (`tracking_slots_of`)."""
        return tracking_slots_of(self.mamba_strategy, self.event_loop)


@dataclass(frozen=True)
class SchedulerConfig:
    """The server settings a scheduler protocol runs with, under SGLang's `ServerArgs` names.

    `chunked_prefill_size` None turns chunked prefill off; `max_running_requests` None means the
    request pool's size; `eos_token_id` is the token that ends a request when sampled.
    """

    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: int = 16384
    max_running_requests: Optional[int] = None
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    disaggregation_mode: str = "null"
    eos_token_id: int = 99
    # with the extra buffer: decode checkpoints every this many tokens (`--mamba-track-interval`)
    mamba_track_interval: int = 4

    def __post_init__(self):
        if self.chunked_prefill_size is not None:
            _positive_int("SchedulerConfig", "chunked_prefill_size", self.chunked_prefill_size)
        _positive_int("SchedulerConfig", "max_prefill_tokens", self.max_prefill_tokens)
        if self.max_running_requests is not None:
            _positive_int("SchedulerConfig", "max_running_requests", self.max_running_requests)
        if self.schedule_policy not in POLICIES:
            raise ValueError(f"SchedulerConfig.schedule_policy must be one of {POLICIES}, got {self.schedule_policy!r}")
        conservativeness = self.schedule_conservativeness
        if isinstance(conservativeness, bool) or not isinstance(conservativeness, (int, float)) or not 0 <= conservativeness < 1e6:
            raise ValueError(f"SchedulerConfig.schedule_conservativeness must be a number >= 0, got {conservativeness!r}")
        if self.disaggregation_mode not in DISAGGREGATION_MODES:
            raise ValueError(
                f"SchedulerConfig.disaggregation_mode must be one of {DISAGGREGATION_MODES}, got {self.disaggregation_mode!r}"
            )
        if isinstance(self.eos_token_id, bool) or not isinstance(self.eos_token_id, int) or self.eos_token_id < 0:
            raise ValueError(f"SchedulerConfig.eos_token_id must be a non-negative int, got {self.eos_token_id!r}")
        _positive_int("SchedulerConfig", "mamba_track_interval", self.mamba_track_interval)
