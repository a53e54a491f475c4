"""Every trace file under tests/regressions/ is one test: replayed against the cache under test
(`--cache-impl`, default impl), every check on.

A trace with `known_failure` set records a finding before it is fixed, in the cache and release
it names: replayed there it must still fail with the check it recorded, and turns into an error
the day it passes, so the fixed bug gets promoted (clear `known_failure`). Replayed on any other
cache it must pass: under that cache's own scheduler, with that release's own known findings set
aside (a trace about one path must not fail on another release's known bug; each of those has a
trace of its own). Traces under `pending/` are fresh captures from failing runs.
"""

import glob
import os

import pytest

from harness.caches import cache_class, cache_name, cache_release
from harness.findings import KNOWN_FINDINGS, set_aside
from harness.protocols.direct_api import DIRECT_OPERATIONS
from harness.protocols import protocol_class
from harness.trace import judge, load_trace, replay, replay_protocol

HERE = os.path.dirname(__file__)
TRACES = sorted(glob.glob(os.path.join(HERE, "regressions", "**", "*.json"), recursive=True))


def trace_id(path: str) -> str:
    return os.path.relpath(path, os.path.join(HERE, "regressions"))


def skip_unreplayable(trace, cache_factory) -> None:
    """Skip, saying why, a trace recorded with server settings the cache or the protocol it
    replays under cannot run (impl has no extra buffer yet)."""
    refusal = protocol_class(replay_protocol(trace, cache_factory)).refusal(cache_factory, trace.scheduler, trace.config)
    if refusal:
        pytest.skip(f"recorded with settings this cache cannot replay: {refusal}")


def replay_problem(path: str, cache_factory, device) -> str:
    """What is wrong with replaying the trace at `path` on `device` (empty when nothing is)."""
    trace = load_trace(path)
    name, release = cache_name(cache_factory), cache_release(cache_factory)
    own = trace.impl == name and trace.impl_version == release
    aside = None if own else set_aside(["all"], release)
    verdict = replay(trace, cache_factory, device=str(device), source=path, set_aside=aside)
    return judge(trace, verdict, impl=name, version=release)


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_trace_replays(path, cache_under_test, device):
    trace = load_trace(path)
    direct = sorted({op["op"] for op in trace.operations} & set(DIRECT_OPERATIONS))
    if direct and not cache_class(cache_under_test).direct_api:
        pytest.skip(f"the trace calls the cache directly ({direct}); only a cache with a direct API takes that")
    skip_unreplayable(trace, cache_under_test)
    problem = replay_problem(path, cache_under_test, device)
    if problem:
        pytest.fail(f"{path} {problem}")


def test_the_hard_scenarios_are_recorded():
    names = {os.path.basename(p) for p in TRACES}
    assert {
        "cascade-tombstone-deletion.json",
        "cow-with-full-mamba-pool.json",
        "chunked-prefill-across-a-split.json",
    } <= names


def test_every_known_finding_has_a_trace_that_fails_with_its_check():
    recorded = {}
    for path in TRACES:
        trace = load_trace(path)
        if trace.known_failure:
            recorded.setdefault(trace.known_failure.split(":")[0], trace.failure.check)
    for name, finding in KNOWN_FINDINGS.items():
        assert recorded.get(name) == finding.check, f"finding {name} has no known_failure trace failing with {finding.check}"
