"""`Draws`: where the harness's choices come from, Hypothesis' `data` or a seeded `random.Random`.

The operation chooser asks a `Draws` for every choice, so the Hypothesis state machine and the
random engine share one definition of what a program looks like.
"""

from __future__ import annotations

import random
from typing import Protocol, Sequence, Tuple

from hypothesis import strategies as st

from harness.config import CacheConfig
from strategies.scenarios import Scenario, choices
from strategies.tokens import Tokens, sharing_prefix, sharing_prefixes


class Draws(Protocol):
    def integer(self, lo: int, hi: int, label: str) -> int: ...

    def pick(self, options: Tuple, label: str): ...

    def tokens(self, corpus: Sequence[Tokens], scenario: Scenario, min_len: int, label: str) -> Tokens: ...

    def config(self, scenario: Scenario, device: str) -> CacheConfig: ...


class HypothesisDraws:
    """Choices drawn from a Hypothesis `data` object, each with a label for the printed program."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.data.draw(st.integers(lo, hi), label=label)

    def pick(self, options: Tuple, label: str):
        return self.data.draw(choices(tuple(options)), label=label)

    def tokens(self, corpus, scenario: Scenario, min_len: int, label: str) -> Tokens:
        return self.data.draw(sharing_prefixes(corpus, scenario.vocab, scenario.max_len, min_len), label=label)

    def config(self, scenario: Scenario, device: str) -> CacheConfig:
        return self.data.draw(scenario.pools(device), label="config")


class RandomDraws:
    """Choices from a seeded `random.Random`: no Hypothesis overhead, same distribution shape."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Tuple, label: str):
        return self.rng.choice(options)

    def tokens(self, corpus, scenario: Scenario, min_len: int, label: str) -> Tokens:
        return sharing_prefix(self.rng.randint, corpus, scenario.vocab, scenario.max_len, min_len)

    def config(self, scenario: Scenario, device: str) -> CacheConfig:
        return scenario.config(self.rng.randint, device)


__all__ = ["Draws", "HypothesisDraws", "RandomDraws"]
