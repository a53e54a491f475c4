"""Hypothesis strategies for the harness: token sequences, pool sizes, operation mixes."""

from strategies.scenarios import (
    DEFAULT_MIX,
    OPERATIONS,
    SCENARIOS,
    Scenario,
    choices,
    pool_config,
    pool_configs,
    weighted_operations,
)
from strategies.tokens import fresh_tokens, sharing_prefixes

__all__ = [
    "DEFAULT_MIX",
    "OPERATIONS",
    "SCENARIOS",
    "Scenario",
    "choices",
    "fresh_tokens",
    "pool_config",
    "weighted_operations",
    "pool_configs",
    "sharing_prefixes",
]
