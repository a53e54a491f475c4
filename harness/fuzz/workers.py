"""Several fuzz processes sharing the example database; progress from their counters."""

from __future__ import annotations

import multiprocessing
import queue
import sys
from typing import Any, Dict, List, TextIO

from harness.fuzz.options import FuzzOptions
from harness.fuzz.progress import Progress
from harness.fuzz.rounds import run_single


def _worker_main(options: FuzzOptions, worker: int, shared, results) -> None:
    results.put((worker, run_single(options, sys.stdout, worker, shared)))


def run_workers(options: FuzzOptions, out: TextIO) -> List[Dict[str, Any]]:
    """`options.workers` processes, each with its own share of the rounds."""
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    shared = manager.dict({i: (0, 0, 0) for i in range(options.workers)})
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(options, i, shared, results)) for i in range(options.workers)]
    for p in procs:
        p.start()
    progress = Progress(options.seconds, out)
    collected: Dict[int, Dict[str, Any]] = {}
    while len(collected) < len(procs):
        try:
            worker, report = results.get(timeout=0.5)
            collected[worker] = report
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
        totals = [sum(v[k] for v in shared.values()) for k in range(3)]
        progress.show(*totals)
    for p in procs:
        p.join()
    missing = [i for i in range(options.workers) if i not in collected]
    if missing:
        raise RuntimeError(f"fuzz worker(s) {missing} died without a report")
    totals = [sum(r[k] for r in collected.values()) for k in ("programs", "steps")]
    progress.show(totals[0], totals[1], sum(len(r["failures"]) for r in collected.values()), final=True)
    return [collected[i] for i in sorted(collected)]
