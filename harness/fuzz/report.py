"""The fuzz report: what ran, what failed, what was reached, how much memory it took."""

from __future__ import annotations

import json
import platform
from collections import Counter
from typing import Any, Dict, List

import hypothesis
import torch

from harness.fuzz.buckets import failing, merge_buckets
from harness.fuzz.options import FuzzOptions


def build_report(options: FuzzOptions, reports: List[Dict[str, Any]], versions: Dict[str, str]) -> Dict[str, Any]:
    """Merge the processes' reports into one."""
    elapsed = max(r["elapsed_seconds"] for r in reports)
    steps = sum(r["steps"] for r in reports)
    reach: Counter = Counter()
    set_aside_counts: Counter = Counter()
    for r in reports:
        reach.update(r["reach"])
        set_aside_counts.update(r["set_aside_counts"])
    buckets = merge_buckets([r["buckets"] for r in reports], set_aside_counts)
    firsts = [r for r in reports if r["first_failure_programs"] is not None]
    return {
        "engine": options.engine,
        "impl": options.impl,
        "protocol": options.protocol,
        "set_aside": options.known_findings().names(),
        "budget_seconds": options.seconds,
        "elapsed_seconds": round(elapsed, 3),
        "workers": options.workers,
        "configs": options.configs,
        "seed": options.seed,
        "database": options.db if options.engine == "hypothesis" else None,
        "programs": sum(r["programs"] for r in reports),
        "steps": steps,
        "steps_per_second": round(steps / elapsed, 1) if elapsed > 0 else 0.0,
        "fail_on_known": options.fail_on_known,
        # every distinct failure, and those that fail the run (new ones, or all with fail_on_known)
        "buckets": buckets,
        "failures": failing(buckets, options.fail_on_known),
        # programs that ended on (or passed over) a failure set aside, by signature or finding
        "set_aside_counts": dict(sorted(set_aside_counts.items())),
        "first_failure_programs": min((r["first_failure_programs"] for r in firsts), default=None),
        "first_failure_seconds": min((round(r["first_failure_seconds"], 2) for r in firsts), default=None),
        "reach": dict(sorted(reach.items())),
        # per process: the peak after its first round, and at its end (bounded pools: no growth)
        "peak_rss_mib": max(r["peak_rss_mib"] for r in reports),
        "peak_rss_after_first_round_mib": max(r["peak_rss_after_first_round_mib"] or 0 for r in reports),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "hypothesis": hypothesis.__version__,
            **versions,
        },
        "device": torch.cuda.get_device_name(0) if torch.device(options.device).type == "cuda" else "cpu",
    }


def write_report(path: str, report: Dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
        f.write("\n")
