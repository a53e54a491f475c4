"""What one harness run builds and runs with: the pools (`CacheConfig`) and the scheduler's server
settings (`SchedulerConfig`). Both are plain frozen data: strategies draw them, traces record them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

POLICIES = ("fcfs", "lpm")
DISAGGREGATION_MODES = ("null", "prefill")
# `--mamba-radix-cache-strategy`: the request's running state alone, or with track slots the
# forward pass checkpoints into (the extra buffer; the lazy variant is not drawn yet)
MAMBA_STRATEGIES = ("no_buffer", "extra_buffer")
# the scheduler's event loop: `event_loop_normal` (`--disable-overlap-schedule`) or
# `event_loop_overlap`, which launches a batch before it processes the one before's results
EVENT_LOOPS = ("normal", "overlap")


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
}
# one combination of them: (field, value) pairs in `SERVER_SETTINGS`' order
Serving = Tuple[Tuple[str, str], ...]


def serving(mamba_strategy: str = "no_buffer", event_loop: str = "normal") -> Serving:
    """The combination of server settings named."""
    return (("mamba_strategy", mamba_strategy), ("event_loop", event_loop))


# the combinations SGLang's server-args validation lets through (0.5.16 .. 0.5.23
# `mamba_hook.validate_mamba_no_buffer`: no_buffer forces the normal loop), with the weights a
# fuzz draws them with: what SGLang serves by default (the extra buffer under the overlap loop)
# most often
SERVINGS: Tuple[Tuple[Serving, int], ...] = (
    (serving("extra_buffer", "overlap"), 2),
    (serving("extra_buffer", "normal"), 1),
    (serving("no_buffer", "normal"), 1),
)
NO_BUFFER = serving()


def setting_refusal(taken: Mapping[str, Tuple[str, ...]], settings: Mapping[str, str]) -> str:
    """Why `settings` (field -> value) fall outside `taken` (field -> the values taken; a field
    not named takes every value), as "<what> [...] only, not '<value>'"; "" when they do not."""
    for name, value in settings.items():
        values = taken.get(name, SERVER_SETTINGS[name][1])
        if value not in values:
            return f"{SERVER_SETTINGS[name][0]} {list(values)} only, not {value!r}"
    return ""


def servings_taken(takers: Sequence[Mapping[str, Tuple[str, ...]]], pinned: Mapping[str, str] = {}) -> Tuple[Serving, ...]:
    """The legal combinations (`SERVINGS`) every taker takes and that agree with `pinned`, each
    repeated by its weight (a uniform pick draws with the weights); empty when none is."""
    def taken(combination: Serving) -> bool:
        settings = dict(combination)
        return all(settings[k] == v for k, v in pinned.items()) and not any(setting_refusal(t, settings) for t in takers)

    return tuple(c for c, weight in SERVINGS if taken(c) for _ in range(weight))


def setting_flags(settings: Mapping[str, str]) -> str:
    """Server settings (field -> value) as the command line pins them."""
    return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in settings.items())


def legal_refusal(settings: Mapping[str, str]) -> str:
    """Why SGLang refuses the combination `settings` (some fields), "" when some legal
    combination agrees with them."""
    if any(all(dict(c)[k] == v for k, v in settings.items()) for c, _ in SERVINGS):
        return ""
    named = ", ".join(f"{k} {v!r}" for k, v in settings.items())
    return f"SGLang serves no {named} together (no_buffer forces the normal event loop)"


def _positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Pool sizes, device, page size (always 1), Mamba strategy and the event loop the pools
    are built for (SGLang's request pool takes `enable_overlap_schedule`) for a cache under test."""

    kv_size: int
    mamba_size: int
    req_size: int
    max_context_len: int = 256
    device: str = "cpu"
    page_size: int = 1
    mamba_strategy: str = "no_buffer"
    event_loop: str = "normal"

    def __post_init__(self):
        if self.page_size != 1:
            raise ValueError(f"CacheConfig.page_size must be 1 (the only size supported), got {self.page_size!r}")
        for name in ("kv_size", "mamba_size", "req_size", "max_context_len"):
            _positive_int("CacheConfig", name, getattr(self, name))
        if self.mamba_strategy not in MAMBA_STRATEGIES:
            raise ValueError(f"CacheConfig.mamba_strategy must be one of {MAMBA_STRATEGIES}, got {self.mamba_strategy!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"CacheConfig.event_loop must be one of {EVENT_LOOPS}, got {self.event_loop!r}")
        illegal = legal_refusal(self.server_settings)
        if illegal:
            raise ValueError(f"CacheConfig: {illegal}")

    @property
    def server_settings(self) -> Dict[str, str]:
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
