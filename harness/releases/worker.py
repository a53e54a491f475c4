"""One release, in its own process: `python -m harness.releases.worker replay TRACE` or
`... fuzz SECONDS`, with the release first on `PYTHONPATH` (`ReleaseStore.environment`).

It runs every cache of the installed release (`caches_of`) and prints one JSON object per cache
on its own line, prefixed `RESULT `:
  {"release", "cache", "protocol", "status": "passed" | "failed" | "cannot run", ...}
a failure with its `check`, `step` and `message` (a fuzz: `failures`, one per failed program,
each with its trace file), a `cannot run` with its `reason`.

A replay sets aside every known finding except the one the trace records, so that a trace shows
whether its own failure happens on a release, not whether another finding comes first.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from typing import Any, Dict, List, Optional

RESULT = "RESULT "


def _cannot_run(release: str, cache: str, reason: str) -> Dict[str, Any]:
    return {"release": release, "cache": cache, "status": "cannot run", "reason": reason}


def own_finding(trace: Any) -> Optional[str]:
    """The known finding a trace records (its `known_failure` starts with the name), if any."""
    from harness.findings import KNOWN_FINDINGS

    name = (trace.known_failure or "").split(":", 1)[0].strip()
    return name if name in KNOWN_FINDINGS else None


def replay_on(path: str, release: str, cache: str) -> Dict[str, Any]:
    """The trace at `path` replayed on one cache of the installed release."""
    from harness.caches import cache_factory
    from harness.checks import InvariantViolation
    from harness.findings import KNOWN_FINDINGS, SetAside
    from harness.trace import load_trace, replay, replay_protocol

    trace = load_trace(path)
    try:
        factory = cache_factory(cache)
        factory(trace.config)  # an adapter that does not fit the release fails here
    except Exception as exc:  # noqa: BLE001 - any failure to build is the reason it cannot run
        return _cannot_run(release, cache, f"{type(exc).__name__}: {exc}".splitlines()[0])
    protocol = replay_protocol(trace, factory)
    mine = own_finding(trace)
    aside = SetAside((f for name, f in KNOWN_FINDINGS.items() if name != mine), every_release=True)
    verdict = replay(trace, factory, protocol=protocol, source=path, set_aside=aside)
    result = {"release": release, "cache": cache, "protocol": protocol, "steps": len(trace.operations)}
    if verdict.ok:
        return dict(result, status="passed")
    failure = verdict.failure
    if failure.step < 0 and not isinstance(verdict.error, InvariantViolation):
        return _cannot_run(release, cache, f"the harness cannot read it: {type(verdict.error).__name__}: {verdict.error}")
    return dict(result, status="failed", check=failure.check, step=failure.step, message=failure.message.splitlines()[0][:300])


def fuzz_on(seconds: float, release: str, cache: str, trace_dir: str, seed: Optional[int]) -> Dict[str, Any]:
    """A fuzz of one cache of the installed release for `seconds`, every known finding set aside."""
    from harness.caches import cache_factory
    from harness.fuzz import FuzzOptions, fuzz
    from harness.findings import KNOWN_FINDINGS
    from strategies import SCENARIOS
    from strategies.config import CacheConfig

    try:
        cache_factory(cache)(CacheConfig())
    except Exception as exc:  # noqa: BLE001
        return _cannot_run(release, cache, f"{type(exc).__name__}: {exc}".splitlines()[0])
    options = FuzzOptions(
        seconds=seconds, impl=cache, protocol=None, profile="nightly", configs=sorted(SCENARIOS), seed=seed, db=None,
        report=None, engine="random", workers=1, fail_fast=False, set_aside=sorted(KNOWN_FINDINGS),
    )
    options.trace_dir = trace_dir
    report = fuzz(options, io.StringIO())
    failures = [
        {"check": f.get("check"), "step": f.get("step"), "message": str(f.get("message", "")).splitlines()[0][:300], "trace": f.get("trace")}
        for f in report["failures"]
    ]
    return {
        "release": release, "cache": cache, "status": "failed" if failures else "passed",
        "programs": report.get("programs"), "steps": report.get("steps"), "failures": failures,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.releases.worker")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay")
    rp.add_argument("trace")
    fz = sub.add_parser("fuzz")
    fz.add_argument("seconds", type=float)
    fz.add_argument("--trace-dir", default=None)
    fz.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    from harness.caches.sglang_loader import SglangUnavailable, sglang_version
    from harness.caches.sglang_releases import caches_of

    try:
        release = sglang_version()
    except SglangUnavailable as exc:
        print(RESULT + json.dumps(_cannot_run("?", "sglang", str(exc))), flush=True)
        return 0
    for cache in caches_of(release):
        if args.command == "replay":
            result = replay_on(args.trace, release, cache)
        else:
            result = fuzz_on(args.seconds, release, cache, args.trace_dir or tempfile.mkdtemp(prefix=f"fuzz-{release}-"), args.seed)
        print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
