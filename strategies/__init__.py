"""Strategies for the harness: token sequences, pool sizes, server settings, operation mixes."""

from strategies.config import CacheConfig, SchedulerConfig
from strategies.scenarios import DEFAULT_MIX, OPERATIONS, SCENARIOS, Scenario, choices, pool_config, weighted_operations
from strategies.tokens import fresh_tokens, sharing_prefixes

__all__ = [
    "DEFAULT_MIX",
    "OPERATIONS",
    "SCENARIOS",
    "CacheConfig",
    "Scenario",
    "SchedulerConfig",
    "choices",
    "fresh_tokens",
    "pool_config",
    "sharing_prefixes",
    "weighted_operations",
]
