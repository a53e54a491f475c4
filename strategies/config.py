"""What one harness run builds and runs with: the pools (`CacheConfig`) and the scheduler's server
settings (`SchedulerConfig`). Both are plain frozen data: strategies draw them, traces record them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

POLICIES = ("fcfs", "lpm")
DISAGGREGATION_MODES = ("null", "prefill")
# `--mamba-radix-cache-strategy`: the request's running state alone, or with track slots the
# forward pass checkpoints into (the extra buffer; the lazy variant is not drawn yet)
MAMBA_STRATEGIES = ("no_buffer", "extra_buffer")


def tracking_slots_of(strategy: str) -> int:
    """Track slots per request beside its running state under Mamba strategy `strategy`: one
    with the extra buffer (the normal event loop; the overlap loop's ping-pong pair is not built
    yet), else none."""
    return 1 if strategy == "extra_buffer" else 0


def _positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """Pool sizes, device, page size (always 1) and Mamba strategy for a cache under test."""

    kv_size: int
    mamba_size: int
    req_size: int
    max_context_len: int = 256
    device: str = "cpu"
    page_size: int = 1
    mamba_strategy: str = "no_buffer"

    def __post_init__(self):
        if self.page_size != 1:
            raise ValueError(f"CacheConfig.page_size must be 1 (the only size supported), got {self.page_size!r}")
        for name in ("kv_size", "mamba_size", "req_size", "max_context_len"):
            _positive_int("CacheConfig", name, getattr(self, name))
        if self.mamba_strategy not in MAMBA_STRATEGIES:
            raise ValueError(f"CacheConfig.mamba_strategy must be one of {MAMBA_STRATEGIES}, got {self.mamba_strategy!r}")

    @property
    def tracking_slots(self) -> int:
        """Track slots per request beside its running state (`tracking_slots_of`)."""
        return tracking_slots_of(self.mamba_strategy)


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
