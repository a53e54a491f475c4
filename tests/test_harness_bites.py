"""The harness catches planted bugs, and Hypothesis prints the shrunk failing program."""

import functools

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from broken_impls import BROKEN
from harness.adapters import ImplAdapter
from harness.machine import machine_for
from strategies import SCENARIOS


@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_planted_bug_is_caught_with_a_printed_program(bug, device, tmp_path):
    adapter = functools.partial(ImplAdapter, cache_class=BROKEN[bug])
    machine = machine_for(SCENARIOS["medium"], adapter_factory=adapter, device=str(device), trace_dir=str(tmp_path))
    budget = settings(settings(), max_examples=max(settings().max_examples, 200), report_multiple_bugs=False)
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=budget)
    program = "\n".join(getattr(caught.value, "__notes__", []))
    assert "state = " in program and "state.step(" in program, program
    assert "Draw 1 (config)" in program, program
    assert len(list(tmp_path.glob("*.json"))) == 1, "the shrunk failure was not saved as a trace"
