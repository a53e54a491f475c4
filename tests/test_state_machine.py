"""The state machine against the cache under test (`--cache-impl`, default `impl`), one test
per scenario so `pytest -n auto` spreads them.

Sizes (examples, steps) come from the Hypothesis profile: `--hypothesis-profile dev|ci|nightly`.
"""

import pytest
from hypothesis.stateful import run_state_machine_as_test

from harness.machine import machine_for
from strategies import SCENARIOS


@pytest.mark.parametrize("scenario", sorted(SCENARIOS), ids=str)
def test_cache_agrees_with_the_model(scenario, adapter_factory, device):
    run_state_machine_as_test(machine_for(SCENARIOS[scenario], adapter_factory, device=str(device)))
