"""Several fuzz processes sharing the example database and the claims on failure signatures
(`harness.fuzz.buckets.Claims`, a manager's dict); progress from their counters."""

from __future__ import annotations

import multiprocessing
import queue
import sys
from typing import Any, Dict, List, TextIO

from harness.fuzz.buckets import Claims
from harness.fuzz.options import FuzzOptions
from harness.fuzz.progress import Progress
from harness.fuzz.rounds import run_single
from harness.fuzz.stop import StopRequest, signals_ignored


def _worker_main(options: FuzzOptions, worker: int, shared, results, stop, claimed) -> None:
    results.put((worker, run_single(options, sys.stdout, worker, shared, stop, Claims(claimed))))


class _Counters:
    """Each worker's (programs, steps, failures), in shared memory: `counters[worker] = (...)`."""

    def __init__(self, ctx: Any, workers: int):
        self.array = ctx.Array("q", 3 * workers, lock=False)

    def __setitem__(self, worker: int, values) -> None:
        self.array[3 * worker:3 * worker + 3] = list(values)

    def totals(self) -> List[int]:
        return [sum(self.array[k::3]) for k in range(3)]


def run_workers(options: FuzzOptions, out: TextIO, stop: StopRequest) -> List[Dict[str, Any]]:
    """`options.workers` processes, each with its own share of the rounds; they stop early when
    `stop` is set (they ignore SIGINT and SIGTERM themselves: `harness.fuzz.stop`)."""
    ctx = multiprocessing.get_context("spawn")
    shared = _Counters(ctx, options.workers)
    results = ctx.Queue()
    with signals_ignored():
        manager = ctx.Manager()  # started with the signals ignored too: a Ctrl-C must not kill it mid-run
        claimed = manager.dict()
        procs = [ctx.Process(target=_worker_main, args=(options, i, shared, results, stop.event, claimed))
                 for i in range(options.workers)]
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
        progress.show(*shared.totals())
    for p in procs:
        p.join()
    manager.shutdown()
    missing = [i for i in range(options.workers) if i not in collected]
    if missing:
        raise RuntimeError(f"fuzz worker(s) {missing} died without a report")
    totals = [sum(r[k] for r in collected.values()) for k in ("programs", "steps")]
    progress.show(totals[0], totals[1], sum(len(r["buckets"]) for r in collected.values()), final=True)
    return [collected[i] for i in sorted(collected)]
