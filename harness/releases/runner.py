"""Running the worker once per release, each in its own process, several at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from harness.releases.store import ReleaseStore, StoreError
from harness.releases.worker import RESULT

CHECKOUT = Path(__file__).resolve().parents[2]
Result = Dict[str, Any]


def run_release(store: ReleaseStore, version: str, worker_args: Sequence[str], timeout: float) -> List[Result]:
    """The worker's results for every cache of `version` (one `cannot run` result, with the
    reason, when the release cannot be fetched, imported or finished in `timeout` seconds)."""

    def cannot(reason: str) -> List[Result]:
        return [{"release": version, "cache": "sglang", "status": "cannot run", "reason": reason}]

    try:
        env = store.environment(version)
    except StoreError as exc:
        return cannot(f"not in the release store and cannot be fetched ({exc})")
    cmd = [sys.executable, "-m", "harness.releases.worker", *worker_args]
    try:
        done = subprocess.run(cmd, cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return cannot(f"did not finish in {timeout:.0f} s")
    results = [json.loads(line[len(RESULT):]) for line in done.stdout.splitlines() if line.startswith(RESULT)]
    for result in results:
        result["release"] = version  # what the store ran, whatever the package said
    if not results:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return cannot(f"the worker exited {done.returncode}: {lines[-1] if lines else 'no output'}")
    return results


def run_releases(
    store: ReleaseStore,
    versions: Sequence[str],
    worker_args: Sequence[str],
    jobs: int,
    timeout: float,
    on_done: Optional[Callable[[str, List[Result]], None]] = None,
) -> List[Result]:
    """Every release's results, in release order; `jobs` processes at a time."""

    def one(version: str) -> List[Result]:
        results = run_release(store, version, worker_args, timeout)
        if on_done is not None:
            on_done(version, results)
        return results

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        per_release = list(pool.map(one, versions))
    return [result for results in per_release for result in results]
