"""Every trace file under tests/regressions/ is one test: replayed against impl, every check on.

A trace with `known_failure` set records a bug before it is fixed: it must still fail with the
check it recorded, and turns into an error the day it passes, so the fixed bug gets promoted
(clear `known_failure`). Traces under `pending/` are fresh captures from failing runs.
"""

import glob
import os

import pytest

from harness.trace import judge, load_trace, replay

HERE = os.path.dirname(__file__)
TRACES = sorted(glob.glob(os.path.join(HERE, "regressions", "**", "*.json"), recursive=True))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, os.path.join(HERE, "regressions")))
def test_trace_replays(path, device):
    trace = load_trace(path)
    problem = judge(trace, replay(trace, device=str(device), source=path))
    if problem:
        pytest.fail(f"{path} {problem}")


def test_the_hard_scenarios_are_recorded():
    names = {os.path.basename(p) for p in TRACES}
    assert {
        "cascade-tombstone-deletion.json",
        "cow-with-full-mamba-pool.json",
        "chunked-prefill-across-a-split.json",
    } <= names
