"""`python -m harness fuzz`: a time-budgeted fuzz of a cache against the model.

Two engines share the operation chooser (`harness.program`) and every check:
  hypothesis  the state machine (`harness.engines.hypothesis_engine`), in rounds of examples,
              with an example database (a directory, or `redis://host:port/n` shared by runners);
  random      seeded random programs (`harness.engines.random_engine`) without Hypothesis'
              per-step overhead; a failing program is shrunk by delta debugging.
Each distinct failure (`harness.signature`) becomes a bucket with one shrunk trace and is set aside
for the rest of the run, in every process (`harness.fuzz.buckets`): every configuration goes on
being fuzzed until the budget ends (or, with `fail_fast`, the first failure that fails the run).
New signatures fail the run; known findings (`harness.findings`) only with `fail_on_known`.
`workers` processes share the database and the signatures found (`harness.fuzz.workers`).
The report's format is docs/fuzz-report.md.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from typing import Any, Dict, List, TextIO

import impl
from harness.caches import cache_class, cache_factory, cache_release, default_protocol
from harness.findings import KNOWN_FINDINGS
from harness.fuzz.buckets import summarize
from harness.fuzz.options import FuzzOptions
from harness.fuzz.report import build_report, write_report
from harness.fuzz.rounds import run_single
from harness.fuzz.stop import StopRequest, stop_on_signals
from harness.fuzz.workers import run_workers
from harness.protocols import protocol_class
from strategies import SCENARIOS
from strategies.config import NO_BUFFER, SERVER_SETTINGS


def fuzz(options: FuzzOptions, out: TextIO = sys.stdout) -> Dict[str, Any]:
    """Run the fuzz; returns the report (also written to `options.report` when given). SIGINT or
    SIGTERM stops it between rounds, with its report (`interrupted` names the signal)."""
    options.check()
    factory = cache_factory(options.impl)
    protocol = protocol_class(options.protocol or default_protocol(factory))
    out.write(
        f"fuzz: {options.engine} engine, {options.impl} under {protocol.title()} against the model on "
        f"{options.device}, {options.seconds:.0f}s, {options.workers} worker(s), configurations {options.configs}\n"
    )
    modes = list(protocol.disaggregation_modes)
    if options.left_out:
        out.write(f"fuzz: left out {options.left_out}: {options.left_out_why}\n")
    elif options.protocol is None:
        other = [c for c in options.configs if len(options.protocols_of(SCENARIOS[c], factory)) > 1]
        if other:
            out.write(f"fuzz: {other} run under the {cache_class(factory).default_protocol} protocol: {protocol.title()} runs disaggregation modes {modes} only\n")
    drawn = {c: options.scenario(c).servings for c in options.configs}
    if any(set(servings) != {NO_BUFFER} for servings in drawn.values()):
        by: Dict[str, List[str]] = {}
        for c, servings in drawn.items():
            names = ["/".join(str(v) for _, v in s) for s in dict.fromkeys(servings)]
            by.setdefault(", ".join(names), []).append(c)
        fields = "/".join(name.replace("_", " ") for name in SERVER_SETTINGS)
        out.write(f"fuzz: server settings ({fields}) " + "; ".join(f"{names} in {configs}" for names, configs in by.items()) + "\n")
    if options.impl.startswith("sglang"):
        from harness.caches.sglang_loader import development_note

        note = development_note()
        if note:
            out.write(f"fuzz: {note}\n")
    ctx = multiprocessing.get_context("spawn")
    with stop_on_signals(StopRequest(ctx.Event() if options.workers > 1 else threading.Event())) as stop:
        reports = run_workers(options, out, stop) if options.workers > 1 else [run_single(options, out, stop=stop)]
    versions = {"impl": impl.__version__}
    if options.impl == "sglang":
        from harness.caches.sglang_loader import sglang_version

        versions["sglang"] = sglang_version()
    report = build_report(options, reports, versions)
    report["interrupted"] = stop.signal_name
    if options.report:
        write_report(options.report, report)
    stopped = f", stopped early by {stop.signal_name}" if stop.signal_name else ""
    out.write(
        f"fuzz: {report['programs']} programs, {report['steps']} steps ({report['steps_per_second']}/s) in "
        f"{report['elapsed_seconds']:.0f}s, {len(report['buckets'])} distinct failure(s), {len(report['failures'])} failing "
        f"the run, peak memory {report['peak_rss_mib']} MiB{stopped}\n"
    )
    summarize(report["buckets"], options.fail_on_known, out)
    known = [f.name for f in KNOWN_FINDINGS.values() if f.meets(cache_release(factory))]
    if any(b["known"] for b in report["buckets"]) and not options.set_aside:
        out.write(
            f"fuzz: this release has {len(known)} known findings (docs/findings.md); "
            f"--set-aside all keeps programs away from them from the start\n"
        )
    return report


__all__ = ["FuzzOptions", "fuzz"]
