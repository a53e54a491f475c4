"""Delta debugging of a failing trace: the fewest operations that still fail the same way.

Both engines use it: the random engine on its failing program, the Hypothesis engine on the trace
its failing example wrote (Hypothesis' own shrinker takes minutes on these programs, ddmin a few
seconds at most).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional

from harness.caches import CacheFactory
from harness.trace import Failure, Trace, TraceError, load_trace, replay, save_trace


def same_failure(failure: Failure, other: Optional[Failure]) -> bool:
    """Whether `other` is the same failure as `failure`: the same signature
    (`harness.signature`), or for a failure recorded without one, the same check."""
    if other is None:
        return False
    if failure.signature is not None and other.signature is not None:
        return failure.signature.same_as(other.signature)
    return failure.check == other.check


def shrink_operations(trace: Trace, cache_factory: CacheFactory, protocol: Optional[str] = None, until: Optional[float] = None) -> Trace:
    """Delta debugging (ddmin over complements) of a failing trace's operations, keeping only
    reductions that still fail the same way (`same_failure`); past `until` (`time.monotonic()`)
    it tries no more, keeping the shortest failing trace found so far."""

    def fails(ops: List[Dict[str, Any]]) -> bool:
        if until is not None and time.monotonic() > until:
            return False
        try:
            verdict = replay(replace(trace, operations=ops), cache_factory, protocol=protocol)
        except TraceError:
            return False
        return same_failure(trace.failure, verdict.failure)

    ops = list(trace.operations)
    chunks = 2
    while len(ops) >= 2:
        size = -(-len(ops) // chunks)
        for start in range(0, len(ops), size):
            complement = ops[:start] + ops[start + size :]
            if complement and fails(complement):
                ops = complement
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(ops):
                break
            chunks = min(len(ops), chunks * 2)
    verdict = replay(replace(trace, operations=ops), cache_factory, protocol=protocol)
    return replace(trace, operations=ops, failure=verdict.failure)


def shrink_saved(path: str, cache_factory: CacheFactory, trace_dir: str, until: Optional[float] = None) -> Optional[str]:
    """Shrink the failing trace saved at `path` (trying until `until`, see `shrink_operations`)
    and save the result in its place; returns the
    new path, or None when the trace is gone: another worker that failed the same way (the same
    operations, so the same file name) is shrinking it, and reports it."""
    try:
        trace = load_trace(path)
    except TraceError:
        if os.path.exists(path):
            raise
        return None
    shrunk = save_trace(shrink_operations(trace, cache_factory, until=until), trace_dir)
    if os.path.abspath(shrunk) != os.path.abspath(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    return shrunk
