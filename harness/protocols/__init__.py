"""The scheduler protocols: one module per release whose scheduler drives a hybrid cache.

  contract        what a correct scheduler of 0.5.4's era does (0.5.4's calls, its mistakes
                  corrected) plus direct API calls: the protocol `impl` is checked under
  sglang-0.5.4    SGLang 0.5.4's scheduler (`sglang_0_5_4`)
  unified         the contract's calls as the scheduler of the unified-cache era makes them
                  (`unified`: a chunked request keeps its row between chunks);
  unified-0.5.20  the same with 0.5.20's room for three Mamba states per admitted request
  scheduler       the release's own `Scheduler`, built with a stand-in model worker
                  (`scheduler`, `harness.real_scheduler`): SGLang 0.5.22, 0.5.23

`docs/scheduler-protocol.md` maps each release's call sites to the methods that make them.
"""

from __future__ import annotations

from typing import Dict, Optional

from harness.caches import CacheFactory, cache_class, default_protocol
from harness.protocols.base import SchedulerProtocol
from harness.protocols.contract import ContractScheduler
from harness.protocols.scheduler import RealSchedulerProtocol
from harness.protocols.sglang_0_5_4 import Sglang054Scheduler
from harness.protocols.unified import Unified0520Scheduler, UnifiedScheduler
from strategies.config import CacheConfig, SchedulerConfig

PROTOCOLS: Dict[str, type] = {
    cls.name: cls for cls in (ContractScheduler, Sglang054Scheduler, UnifiedScheduler, Unified0520Scheduler, RealSchedulerProtocol)
}


def protocol_for(cache_factory: CacheFactory, scheduler: SchedulerConfig, config: Optional[CacheConfig] = None) -> str:
    """The cache's own protocol (`harness.caches.default_protocol`), or, where that cannot run
    with these server settings (the real scheduler runs no disaggregation), its release's
    hand-written one."""
    own = default_protocol(cache_factory)
    if protocol_class(own).refusal(cache_factory, scheduler, config):
        return cache_class(cache_factory).default_protocol
    return own


def protocol_class(name: str) -> type:
    """The protocol named `name`; ValueError naming the known ones otherwise."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"--protocol must be one of {sorted(PROTOCOLS)}, got {name!r}") from None


__all__ = ["PROTOCOLS", "ContractScheduler", "RealSchedulerProtocol", "SchedulerProtocol", "Sglang054Scheduler", "Unified0520Scheduler", "UnifiedScheduler", "protocol_class", "protocol_for"]
