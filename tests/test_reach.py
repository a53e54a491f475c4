"""The state machine reaches every hard path within a fixed budget.

Runs the tiny, chunked and lock-heavy configurations for a fixed number of programs and fails
naming every reach label (`harness.machine.REACH_LABELS`) that never occurred.
"""

from collections import Counter

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.machine import REACH_LABELS, machine_for
from strategies import SCENARIOS

BUDGET = settings(settings(), max_examples=60, stateful_step_count=50)


def test_every_reach_label_occurs_within_the_budget(device):
    seen = Counter()

    def record(label: str) -> None:
        seen[label] += 1

    for name in ("tiny", "chunked", "lock_heavy", "medium"):
        machine = machine_for(SCENARIOS[name], device=str(device), event_sink=record)
        run_state_machine_as_test(machine, settings=BUDGET)
    missing = [label for label in REACH_LABELS if seen[label] == 0]
    assert not missing, f"never reached: {missing}; seen: {dict(seen)}"
