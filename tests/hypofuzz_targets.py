"""The state machines as Hypothesis test cases, for HypoFuzz (`hypothesis fuzz -- tests/hypofuzz_targets.py`).

Not collected by the default `pytest -n auto` run (the file name does not match test_*.py), since
tests/test_state_machine.py already runs the same machines; pytest runs it when named.
"""

from harness.engines.hypothesis_engine import machine_for
from strategies import SCENARIOS

for _name, _scenario in SCENARIOS.items():
    globals()[f"Test{_name.title().replace('_', '')}Machine"] = machine_for(_scenario, name=f"CacheMachine_{_name}").TestCase
