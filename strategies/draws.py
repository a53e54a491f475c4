"""`Draws`: where the harness's choices come from, Hypothesis' `data` or a seeded `random.Random`.

The operation chooser asks a `Draws` for every choice, so the Hypothesis state machine and the
random engine share one definition of what a program looks like.
"""

from __future__ import annotations

import random
from typing import Protocol, Sequence, Tuple

from hypothesis import strategies as st

from strategies.config import CacheConfig, SchedulerConfig
from strategies.scenarios import Scenario, choices
from strategies.tokens import Tokens, sharing_prefix, sharing_prefixes


class Draws(Protocol):
    def integer(self, lo: int, hi: int, label: str) -> int: ...

    def pick(self, options: Tuple, label: str): ...

    def flag(self, label: str) -> bool: ...

    def tokens(self, corpus: Sequence[Tokens], scenario: Scenario, min_len: int, label: str) -> Tokens: ...

    def config(self, scenario: Scenario, device: str) -> CacheConfig: ...

    def scheduler(self, scenario: Scenario, config: CacheConfig) -> SchedulerConfig: ...


@st.composite
def _with_integers(draw, make):
    """What `make(integer)` builds, each integer drawn from Hypothesis."""
    return make(lambda lo, hi: draw(st.integers(lo, hi)))


class HypothesisDraws:
    """Choices drawn from a Hypothesis `data` object, each with a label for the printed program."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.data.draw(st.integers(lo, hi), label=label)

    def pick(self, options: Tuple, label: str):
        return self.data.draw(choices(tuple(options)), label=label)

    def flag(self, label: str) -> bool:
        return self.data.draw(st.booleans(), label=label)

    def tokens(self, corpus, scenario: Scenario, min_len: int, label: str) -> Tokens:
        return self.data.draw(sharing_prefixes(corpus, scenario.vocab, scenario.max_len, min_len), label=label)

    def config(self, scenario: Scenario, device: str) -> CacheConfig:
        return self.data.draw(_with_integers(lambda integer: scenario.config(integer, device)), label="config")

    def scheduler(self, scenario: Scenario, config: CacheConfig) -> SchedulerConfig:
        return self.data.draw(_with_integers(lambda integer: scenario.scheduler(integer, config)), label="scheduler")


class RandomDraws:
    """Choices from a seeded `random.Random`: no Hypothesis overhead, same distribution shape."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Tuple, label: str):
        return self.rng.choice(options)

    def flag(self, label: str) -> bool:
        return self.rng.random() < 0.5

    def tokens(self, corpus, scenario: Scenario, min_len: int, label: str) -> Tokens:
        return sharing_prefix(self.rng.randint, corpus, scenario.vocab, scenario.max_len, min_len)

    def config(self, scenario: Scenario, device: str) -> CacheConfig:
        return scenario.config(self.rng.randint, device)

    def scheduler(self, scenario: Scenario, config: CacheConfig) -> SchedulerConfig:
        return scenario.scheduler(self.rng.randint, config)


__all__ = ["Draws", "HypothesisDraws", "RandomDraws"]
