"""The state machine against the cache under test (`--cache-impl`, default `impl`) under its own
scheduler (or `--protocol`), one test per scenario so `pytest -n auto` spreads them. Against
SGLang, the release's known findings are set aside (`docs/findings.md`): each has its own trace
under tests/regressions/, and the machine looks for anything else.

Sizes (examples, steps) come from the Hypothesis profile: `--hypothesis-profile dev|ci|nightly`.
"""

import pytest
from hypothesis.stateful import run_state_machine_as_test

from harness.caches import cache_release
from harness.engines.hypothesis_engine import machine_for
from harness.findings import set_aside
from strategies import SCENARIOS


@pytest.mark.parametrize("scenario", sorted(SCENARIOS), ids=str)
def test_cache_agrees_with_the_model(scenario, cache_under_test, protocol, device):
    known = set_aside(["all"], cache_release(cache_under_test))
    machine = machine_for(SCENARIOS[scenario], cache_under_test, device=str(device), protocol=protocol, set_aside=known)
    run_state_machine_as_test(machine)
