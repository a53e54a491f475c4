"""Hypothesis strategies for the harness: token sequences, pool sizes, operation mixes."""

from strategies.scenarios import (
    DEFAULT_MIX,
    OPERATIONS,
    SCENARIOS,
    Scenario,
    choices,
    operations,
    pool_configs,
)
from strategies.tokens import fresh_tokens, sharing_prefixes

__all__ = [
    "DEFAULT_MIX",
    "OPERATIONS",
    "SCENARIOS",
    "Scenario",
    "choices",
    "fresh_tokens",
    "operations",
    "pool_configs",
    "sharing_prefixes",
]
