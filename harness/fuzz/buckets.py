"""A fuzz's failures by signature: one bucket per distinct failure, one shrunk trace for each.

The first failure with a new signature (`harness.signature`) is claimed by the process that found
it (`Claims`, shared by every worker), shrunk and saved; its signature is set aside for the rest
of the run in every process (`SetAside.add_signature`, between rounds), so later programs that
meet it end quietly (`set aside: KEY` events) and the fuzz goes on finding others. A bucket counts
them all. It is `new` unless it matches a known finding of the release (`harness.findings`);
new buckets are what fails the run (every bucket with `fail_on_known`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, MutableMapping, Optional, TextIO

from harness.findings import SetAside
from harness.signature import Signature
from harness.trace import finding_of, load_trace

SET_ASIDE_EVENT = "set aside: "


@dataclass
class Bucket:
    """One distinct failure of a fuzz run (the report's `buckets`, see docs/fuzz-report.md)."""

    key: str
    signature: Dict[str, Any]
    check: str
    message: str  # the representative's first line
    config: str  # the configuration it was first seen in
    first_seen_seconds: float
    count: int = 1  # programs that failed this way (the representative, then those set aside)
    known: Optional[str] = None  # the known finding it matches
    trace: Optional[str] = None  # the representative's shrunk trace
    replay: Optional[str] = None  # the command that replays it

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


class Claims:
    """Which process first found each signature: a dict shared by the workers (a manager's, or a
    plain one for a single process); `claim` is atomic on either."""

    def __init__(self, shared: Optional[MutableMapping[str, Any]] = None):
        self.shared: MutableMapping[str, Any] = {} if shared is None else shared

    def claim(self, signature: Signature, worker: int) -> bool:
        """True for the first process to find `signature`; the others only count it."""
        return self.shared.setdefault(signature.key, (worker, signature.to_json()))[0] == worker

    def sync(self, set_aside: SetAside) -> None:
        """Set aside every signature any process found so far."""
        for _, doc in list(self.shared.values()):
            set_aside.add_signature(Signature.from_json(doc))


def new_bucket(signature: Signature, check: str, message: str, config: str, trace: Optional[str], factory,
               started: float) -> Bucket:
    """The bucket of a new signature, first seen now (`started`: when the process began), judged
    against the known findings by its shrunk trace (`finding_of`)."""
    finding = finding_of(load_trace(trace), factory) if trace else None
    return Bucket(
        key=signature.key,
        signature=signature.to_json(),
        check=check,
        message=message.removeprefix(f"[{check}] ").splitlines()[0] if message.strip() else "",
        config=config,
        first_seen_seconds=round(time.monotonic() - started, 2),
        known=finding.name if finding else None,
        trace=trace,
        replay=f"python -m harness replay {trace}" if trace else None,
    )


def merge_buckets(per_worker: List[List[Dict[str, Any]]], set_aside_counts: Dict[str, int]) -> List[Dict[str, Any]]:
    """Every process's buckets as one list, by first seen; each counts the programs every process
    ended on its signature."""
    merged = sorted((b for found in per_worker for b in found), key=lambda b: b["first_seen_seconds"])
    return [dict(b, count=b["count"] + set_aside_counts.get(b["key"], 0)) for b in merged]


def failing(buckets: List[Dict[str, Any]], fail_on_known: bool) -> List[Dict[str, Any]]:
    """The buckets that fail the run: the new ones, or every one with `fail_on_known`."""
    return [b for b in buckets if fail_on_known or b["known"] is None]


def announce(bucket: Bucket, out: TextIO) -> None:
    """The lines a fuzz prints when it finds a new bucket."""
    kind = f"known finding {bucket.known}" if bucket.known else "NEW failure"
    out.write(f"\nfuzz: {kind} in {bucket.config} at {bucket.first_seen_seconds:.0f}s: [{bucket.check}] {bucket.message}\n")
    out.write(f"fuzz: signature {bucket.key} (set aside for the rest of the run)\n")
    if bucket.trace:
        out.write(f"fuzz: trace {bucket.trace}\nfuzz: replay with: {bucket.replay}\n")


def summarize(buckets: List[Dict[str, Any]], fail_on_known: bool, out: TextIO) -> None:
    """The summary's list of buckets: new ones first, each with its count, first sighting and trace."""
    if not buckets:
        return
    new = [b for b in buckets if b["known"] is None]
    quiet_known = not fail_on_known and len(new) < len(buckets)
    out.write(f"fuzz: {len(buckets)} distinct failure(s), {len(new)} new"
              f"{' (known findings do not fail the run; --fail-on-known makes them)' if quiet_known else ''}:\n")
    for b in sorted(buckets, key=lambda b: (b["known"] is not None, b["first_seen_seconds"])):
        label = "NEW  " if b["known"] is None else f"known {b['known']}: "
        out.write(f"  {label}{b['key']}\n      {b['count']} program(s), first at {b['first_seen_seconds']:.0f}s in {b['config']}\n")
        if b["trace"]:
            out.write(f"      {b['replay']}\n")
