"""Every trace file under tests/regressions/ is one test: replayed against impl, every check on.

A trace with `known_failure` set records a bug before it is fixed: it must still fail with the
check it recorded, and turns into an error the day it passes, so the fixed bug gets promoted
(clear `known_failure`). Traces under `pending/` are fresh captures from failing runs.
"""

import glob
import os

import pytest

from harness.trace import load_trace, replay

HERE = os.path.dirname(__file__)
TRACES = sorted(glob.glob(os.path.join(HERE, "regressions", "**", "*.json"), recursive=True))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, os.path.join(HERE, "regressions")))
def test_trace_replays(path, device):
    trace = load_trace(path)
    verdict = replay(trace, device=str(device), source=path)
    if trace.known_failure:
        if verdict.ok:
            pytest.fail(f"{path} is marked as a known failure ({trace.known_failure}) but now passes: "
                        f"clear known_failure to promote it to a regression test")
        recorded = trace.failure.check if trace.failure else None
        assert recorded is None or verdict.failure.check == recorded, (
            f"{path} fails differently than recorded: {verdict.failure.check} != {recorded}"
        )
    else:
        assert verdict.ok, f"{path} failed at step {verdict.failure.step}: {verdict.failure.message}"


def test_the_hard_scenarios_are_recorded():
    names = {os.path.basename(p) for p in TRACES}
    assert {
        "cascade-tombstone-deletion.json",
        "cow-with-full-mamba-pool.json",
        "chunked-prefill-across-a-split.json",
    } <= names
