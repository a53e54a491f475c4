"""One release, in its own process: `python -m harness.releases.worker replay TRACE...` or
`... fuzz SECONDS`, with the release first on `PYTHONPATH` (`ReleaseStore.environment`).

It runs every cache of the installed release (`caches_of`) and prints one JSON object per cache
(and trace) on its own line, prefixed `RESULT `:
  {"release", "cache", "trace", "protocol", "status": "passed" | "failed" | "cannot run", ...}
a failure with its `check`, `step` and `message` (a fuzz: `failures`, one per failed program,
each with its trace file), a `cannot run` with its `reason`.

A replay sets aside every known finding except the one the trace records, so that a trace shows
whether its own failure happens on a release, not whether another finding comes first. It runs
under the trace's own protocol wherever the cache takes that protocol's calls (0.5.4's scheduler
drives every `MambaRadixCache`), else under the cache's own. Where a cache cannot tell (a finding
in a scheduler the release does not run, a check the cache cannot be read for) the result is
`cannot run`, with the reason, not `passed`.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from typing import Any, Dict, List, Optional

from harness.caches import CacheUnderTest, cache_class, cache_factory, default_protocol
from harness.caches.sglang_loader import SglangUnavailable, sglang_version
from harness.caches.sglang_releases import caches_of
from harness.checks import NEEDS_READABLE_NODES, InvariantViolation
from harness.findings import KNOWN_FINDINGS, SetAside
from harness.fuzz import FuzzOptions, fuzz
from harness.protocols import protocol_for
from harness.trace import Trace, TraceError, load_trace, replay
from strategies import SCENARIOS
from strategies.config import CacheConfig

RESULT = "RESULT "
PROBE = CacheConfig(kv_size=24, mamba_size=6, req_size=3, max_context_len=32)  # a fuzz's first build


def _cannot_run(release: str, cache: str, reason: str, **extra: Any) -> Dict[str, Any]:
    return dict(release=release, cache=cache, status="cannot run", reason=reason, **extra)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def own_finding(trace: Trace) -> Optional[str]:
    """The known finding a trace records (its `known_failure` starts with the name), if any."""
    name = (trace.known_failure or "").split(":", 1)[0].strip()
    return name if name in KNOWN_FINDINGS else None


def not_judged(trace: Trace, finding: Optional[str], cut: CacheUnderTest, release: str) -> str:
    """Why this cache cannot tell whether the trace's failure happens on it ('' when it can):
    a fault of a scheduler replays only under that scheduler, and a check that reads nodes says
    nothing of a cache whose nodes cannot be read."""
    if finding is not None and KNOWN_FINDINGS[finding].in_scheduler and release != trace.impl_version:
        return (
            f"not judged: {finding} is a fault of SGLang {trace.impl_version}'s scheduler ({trace.protocol}); "
            f"{release}'s own scheduler is not transcribed (docs/findings.md reads its call sites)"
        )
    recorded = trace.failure.check if trace.failure else None
    if cut.opaque and recorded in NEEDS_READABLE_NODES:
        return f"not judged: the trace fails {recorded}, which reads the tree's nodes; this tree core's cannot be read"
    return ""


def replay_on(path: str, release: str, cache: str) -> Dict[str, Any]:
    """The trace at `path` replayed on one cache of the installed release."""
    trace = load_trace(path)
    try:
        factory = cache_factory(cache)
        probe = factory(trace.config)  # an adapter that does not fit the release fails here
    except Exception as exc:  # noqa: BLE001 - any failure to build is the reason it cannot run
        return _cannot_run(release, cache, _why(exc), trace=path)
    cls = cache_class(factory)
    # the trace's own calls where this cache takes them (the same scheduler, each release's cache)
    protocol = trace.protocol if trace.protocol in cls.protocols else protocol_for(factory, trace.scheduler)
    mine = own_finding(trace)
    reason = not_judged(trace, mine, probe, release)
    if reason:
        return _cannot_run(release, cache, reason, trace=path, protocol=protocol)
    aside = SetAside((f for name, f in KNOWN_FINDINGS.items() if name != mine), every_release=True)
    try:
        verdict = replay(trace, factory, protocol=protocol, source=path, set_aside=aside)
    except TraceError as exc:  # an operation the release's scheduler has no counterpart for
        return _cannot_run(release, cache, f"the trace does not fit its scheduler: {exc}", trace=path, protocol=protocol)
    result = dict(release=release, cache=cache, trace=path, protocol=protocol, steps=len(trace.operations))
    if verdict.ok:
        return dict(result, status="passed")
    failure = verdict.failure
    if failure.step < 0 and not isinstance(verdict.error, InvariantViolation):
        return _cannot_run(release, cache, f"the harness cannot read it: {_why(verdict.error)}", trace=path, protocol=protocol)
    return dict(result, status="failed", check=failure.check, step=failure.step, message=failure.message.splitlines()[0][:300])


def fuzz_on(seconds: float, release: str, cache: str, trace_dir: str, seed: Optional[int]) -> Dict[str, Any]:
    """A fuzz of one cache of the installed release for `seconds` (the random engine, every
    configuration), the known findings of the release (`KnownFinding.meets`) set aside."""
    try:
        factory = cache_factory(cache)
        factory(PROBE)
    except Exception as exc:  # noqa: BLE001
        return _cannot_run(release, cache, _why(exc))
    options = FuzzOptions(
        seconds=seconds, impl=cache, protocol=None, profile="nightly", configs=sorted(SCENARIOS), seed=seed, db=None,
        report=None, engine="random", workers=1, fail_fast=False, trace_dir=trace_dir, set_aside=["all"],
    )
    report = fuzz(options, io.StringIO())
    failures = [
        dict(check=f.get("check"), step=f.get("step"), message=str(f.get("message", "")).splitlines()[0][:300], trace=f.get("trace"))
        for f in report["failures"]
    ]
    return dict(
        release=release, cache=cache, protocol=default_protocol(factory), status="failed" if failures else "passed",
        programs=report.get("programs"), steps=report.get("steps"), failures=failures,
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.releases.worker")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay")
    rp.add_argument("traces", nargs="+")
    fz = sub.add_parser("fuzz")
    fz.add_argument("seconds", type=float)
    fz.add_argument("--trace-dir", default=None)
    fz.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        release = sglang_version()
    except SglangUnavailable as exc:
        print(RESULT + json.dumps(_cannot_run("?", "sglang", str(exc))), flush=True)
        return 0
    for cache in caches_of(release):
        if args.command == "replay":
            results = [replay_on(trace, release, cache) for trace in args.traces]
        else:
            results = [fuzz_on(args.seconds, release, cache, args.trace_dir or tempfile.mkdtemp(prefix=f"fuzz-{release}-"), args.seed)]
        for result in results:
            print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
