"""Every trace file under tests/regressions/ is one test: replayed against the cache under test
(`--cache-impl`, default impl), every check on.

A trace with `known_failure` set records a bug before it is fixed, in the implementation and
version it names: replayed there it must still fail with the check it recorded, and turns into
an error the day it passes, so the fixed bug gets promoted (clear `known_failure`); replayed on
any other cache it must pass. Traces under `pending/` are fresh captures from failing runs.
"""

import glob
import os

import pytest

from harness.trace import judge, load_trace, replay

HERE = os.path.dirname(__file__)
TRACES = sorted(glob.glob(os.path.join(HERE, "regressions", "**", "*.json"), recursive=True))


def trace_id(path: str) -> str:
    return os.path.relpath(path, os.path.join(HERE, "regressions"))


def replay_problem(path: str, adapter_factory, device) -> str:
    """What is wrong with replaying the trace at `path` on `device` (empty when nothing is)."""
    trace = load_trace(path)
    verdict = replay(trace, adapter_factory, device=str(device), source=path)
    adapter = adapter_factory(trace.config)
    return judge(trace, verdict, impl=adapter.name, version=adapter.version())


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_trace_replays(path, adapter_factory, device):
    problem = replay_problem(path, adapter_factory, device)
    if problem:
        pytest.fail(f"{path} {problem}")


def test_the_hard_scenarios_are_recorded():
    names = {os.path.basename(p) for p in TRACES}
    assert {
        "cascade-tombstone-deletion.json",
        "cow-with-full-mamba-pool.json",
        "chunked-prefill-across-a-split.json",
    } <= names
