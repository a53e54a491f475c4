"""From per-release results to a history: the table, and which releases fail, fix and regress.

A series is one line of caches through the releases: `served` (the cache each release's scheduler
builds for hybrid Mamba models: `MambaRadixCache` up to 0.5.15.post1, then `UnifiedRadixCache`
on its default tree core), and each cache family on its own. Its history is the list of changes
of verdict between consecutive releases that ran: where it starts failing, where it is fixed, and
where a fixed failure comes back (a regression).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, TextIO

from harness.caches.sglang_releases import served_cache

Result = Dict[str, Any]

CACHE_LABELS = {
    "sglang": "MambaRadixCache",
    "sglang-python": "UnifiedRadixCache/python",
    "sglang-rust": "UnifiedRadixCache/rust",
}


def label(cache: str) -> str:
    return CACHE_LABELS.get(cache, cache)


def outcome(result: Result) -> str:
    """One cell: passed / failed (check, step) / cannot run (why)."""
    status = result["status"]
    if status == "failed":
        if "failures" in result:
            checks = sorted({f["check"] for f in result["failures"]})
            return f"failed ({len(result['failures'])} program(s): {', '.join(checks)})"
        return f"failed ({result['check']}, step {result['step']})"
    if status == "cannot run":
        return f"cannot run ({result['reason']})"
    return status


def series(results: Sequence[Result]) -> Dict[str, List[Result]]:
    """The results of each series, in release order (`served` first)."""
    lines: Dict[str, List[Result]] = {"served": []}
    for result in results:
        if result["cache"] == served_cache(result["release"]):
            lines["served"].append(result)
        lines.setdefault(label(result["cache"]), []).append(result)
    return lines


def history(line: Sequence[Result]) -> Dict[str, Any]:
    """First failing and first fixed release of a series, and every change after them:
    `changes` lists (release, 'fails' | 'fixed' | 'regressed') where the verdict turns."""
    changes: List[List[str]] = []
    failing, fixed_once = False, False
    for result in line:
        if result["status"] == "cannot run":
            continue
        fails = result["status"] == "failed"
        if fails and not failing:
            changes.append([result["release"], "regressed" if fixed_once else "fails"])
        elif failing and not fails:
            changes.append([result["release"], "fixed"])
            fixed_once = True
        failing = fails
    first_failing = next((r for r, what in changes if what == "fails"), None)
    first_fixed = next((r for r, what in changes if what == "fixed"), None)
    return {
        "first_failing": first_failing,
        "first_fixed": first_fixed,
        "regressions": [r for r, what in changes if what == "regressed"],
        "changes": changes,
        "failing_in": [r["release"] for r in line if r["status"] == "failed"],
        "cannot_run": [r["release"] for r in line if r["status"] == "cannot run"],
        "ran": sum(r["status"] != "cannot run" for r in line),
    }


def summarize(results: Sequence[Result]) -> Dict[str, Dict[str, Any]]:
    return {name: history(line) for name, line in series(results).items() if line}


def print_table(results: Sequence[Result], out: TextIO) -> None:
    """One row per release and cache: the cache, the scheduler protocol it ran under, the outcome."""
    width = max([len(r["release"]) for r in results] + [7])
    out.write(f"{'release':<{width}}  {'cache':<28}  {'protocol':<15}  result\n")
    for r in results:
        served = " *" if r["cache"] == served_cache(r["release"]) else ""
        out.write(f"{r['release']:<{width}}  {label(r['cache']) + served:<28}  {r.get('protocol', '-'):<15}  {outcome(r)}\n")
    out.write("(* the cache the release's scheduler builds for hybrid Mamba models)\n")
    fuzzed = [(r, f) for r in results for f in r.get("failures", ())]
    if fuzzed:
        out.write("\nfailures (replay each with: PYTHONPATH=<the release's store directory> python -m harness replay TRACE --impl CACHE)\n")
        for r, f in fuzzed:
            out.write(f"{r['release']:<{width}}  {r['cache']:<14}  {f['check']}: {f['message'][:100]}\n{'':<{width}}  {'':<14}  {f['trace']}\n")


def describe(name: str, summary: Dict[str, Any]) -> str:
    """One line for a series: where it fails, where it is fixed, where it comes back."""
    if summary["ran"] == 0:
        return f"{name}: ran on no release (each row says why)"
    if not summary["changes"]:
        return f"{name}: never fails"
    words = {"fails": "first failing", "fixed": "fixed in", "regressed": "REGRESSION: fails again in"}
    return f"{name}: " + "; ".join(f"{words[what]} {release}" for release, what in summary["changes"])


def print_summary(summaries: Dict[str, Dict[str, Any]], out: TextIO) -> None:
    for name, summary in summaries.items():
        out.write(describe(name, summary) + "\n")
