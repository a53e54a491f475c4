"""Trace files: a failing (or interesting) run as a replayable, versioned JSON document.

A trace holds the pools and server settings, the scheduler protocol, the operations in the
harness's vocabulary (`harness.operations`), the failure they produced and, for a bug recorded
before it is fixed, a `known_failure` reason. `replay` runs one against any cache with every
check after every step. The format is documented in the README ("Trace files").
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional

from harness.caches import CacheFactory, ImplCache, cache_name, cache_release
from harness.driver import Driver, paused_gc
from harness.findings import KNOWN_FINDINGS, KnownFinding, SetAside, candidate_findings, is_signature_text
from harness.operations import OperationError, check_arguments
from harness.protocols import PROTOCOLS, protocol_for
from harness.signature import Signature, check_of, parse_key, signature_of
from strategies.config import CacheConfig, SchedulerConfig

SCHEMA = "mamba-radix-cache-trace"
VERSION = 3
READS = (2, 3)  # version 3 added the failure's signature and signature keys in set_aside
_TOP_FIELDS = {
    "schema", "version", "config", "scheduler", "protocol", "set_aside", "impl", "impl_version", "scenario",
    "operations", "failure", "known_failure",
}


class TraceError(ValueError):
    """A trace file that cannot be read or replayed; names the file, the step and the field."""

    def __init__(self, source: str, message: str, step: Optional[int] = None, field_name: Optional[str] = None):
        where = source if step is None else f"{source}: step {step}"
        what = message if field_name is None else f"field {field_name!r}: {message}"
        super().__init__(f"{where}: {what}")


@dataclass
class Failure:
    """What a run's first failure was: which check, its message, the step it happened at."""

    check: str
    message: str
    step: int  # index into operations; -1 before the first operation
    signature: Optional[Signature] = None  # what identifies the failure (`harness.signature`)

    def to_json(self) -> Dict[str, Any]:
        doc = {"check": self.check, "message": self.message, "step": self.step}
        if self.signature is not None:
            doc["signature"] = self.signature.to_json()
        return doc


@dataclass
class Trace:
    config: CacheConfig
    operations: List[Dict[str, Any]]
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    protocol: str = "contract"
    set_aside: List[str] = field(default_factory=list)  # known findings and signature keys set aside
    impl: str = "impl"
    impl_version: str = ""
    scenario: Optional[str] = None
    failure: Optional[Failure] = None
    known_failure: Optional[str] = None

    def to_json(self) -> str:
        """Canonical text: the same trace always serialises to the same bytes."""
        doc = {
            "schema": SCHEMA,
            "version": VERSION,
            "config": asdict(self.config),
            "scheduler": asdict(self.scheduler),
            "protocol": self.protocol,
            "set_aside": self.set_aside,
            "impl": self.impl,
            "impl_version": self.impl_version,
            "scenario": self.scenario,
            "operations": self.operations,
            "failure": None if self.failure is None else self.failure.to_json(),
            "known_failure": self.known_failure,
        }
        return json.dumps(doc, sort_keys=True, indent=1) + "\n"

    def stable_name(self) -> str:
        """A file name derived from the failure and the operations."""
        digest = hashlib.sha256(json.dumps(self.operations, sort_keys=True).encode()).hexdigest()[:12]
        check = self.failure.check if self.failure else "passing"
        return f"{check}-{len(self.operations)}ops-{digest}.json"


def _require(source: str, cond: bool, message: str, step: Optional[int] = None, field_name: Optional[str] = None):
    if not cond:
        raise TraceError(source, message, step, field_name)


def _dataclass_field(source: str, doc: dict, name: str, cls: type):
    value = doc.get(name)
    _require(source, isinstance(value, dict), f"expected an object, got {value!r}", field_name=name)
    try:
        return cls(**value)
    except (TypeError, ValueError) as exc:
        raise TraceError(source, str(exc), field_name=name) from None


def parse_trace(doc: Any, source: str = "<trace>") -> Trace:
    """Validate a decoded trace document; `TraceError` names the first bad field."""
    _require(source, isinstance(doc, dict), f"expected a JSON object, got {type(doc).__name__}")
    _require(source, doc.get("schema") == SCHEMA, f"expected {SCHEMA!r}, got {doc.get('schema')!r}", field_name="schema")
    version = doc.get("version")
    _require(source, isinstance(version, int) and not isinstance(version, bool), f"expected an int, got {version!r}", field_name="version")
    _require(source, version <= VERSION, f"version {version} is newer than this harness reads ({VERSION}); upgrade the harness", field_name="version")
    _require(
        source,
        version in READS,
        f"version {version} traces hold direct cache calls from before the scheduler protocols; record the failure again",
        field_name="version",
    )
    unknown = sorted(set(doc) - _TOP_FIELDS)
    _require(source, not unknown, "unknown field", field_name=unknown[0] if unknown else None)
    cache_config = _dataclass_field(source, doc, "config", CacheConfig)
    scheduler = _dataclass_field(source, doc, "scheduler", SchedulerConfig)
    protocol = doc.get("protocol")
    _require(source, protocol in PROTOCOLS, f"expected one of {sorted(PROTOCOLS)}, got {protocol!r}", field_name="protocol")
    aside = doc.get("set_aside", [])
    _require(
        source,
        isinstance(aside, list) and all(isinstance(n, str) and (n in KNOWN_FINDINGS or is_signature_text(n)) for n in aside),
        f"expected a list of known findings {sorted(KNOWN_FINDINGS)} and failure signatures, got {aside!r}",
        field_name="set_aside",
    )
    for name in aside:
        if is_signature_text(name):
            try:
                parse_key(name)
            except ValueError as exc:
                raise TraceError(source, str(exc), field_name="set_aside") from None
    operations = doc.get("operations")
    _require(source, isinstance(operations, list), f"expected a list, got {operations!r}", field_name="operations")
    for step, entry in enumerate(operations):
        _require(source, isinstance(entry, dict) and set(entry) == {"op", "args"}, f"expected {{'op', 'args'}}, got {entry!r}", step)
        try:
            check_arguments(entry["op"], entry["args"])
        except OperationError as exc:
            raise TraceError(source, exc.detail, step, exc.field) from None
    failure = doc.get("failure")
    if failure is not None:
        _require(
            source,
            isinstance(failure, dict) and {"check", "message", "step"} <= set(failure) <= {"check", "message", "step", "signature"},
            f"expected check, message, step (and a signature); got {failure!r}",
            field_name="failure",
        )
        failure = dict(failure)
        if "signature" in failure:
            try:
                failure["signature"] = Signature.from_json(failure["signature"])
            except (TypeError, ValueError) as exc:
                raise TraceError(source, str(exc), field_name="failure") from None
        failure = Failure(**failure)
    known = doc.get("known_failure")
    _require(source, known is None or isinstance(known, str), f"expected null or a reason, got {known!r}", field_name="known_failure")
    for name in ("impl", "impl_version"):
        _require(source, isinstance(doc.get(name, ""), str), f"expected a string, got {doc.get(name)!r}", field_name=name)
    return Trace(
        config=cache_config,
        operations=operations,
        scheduler=scheduler,
        protocol=protocol,
        set_aside=aside,
        impl=doc.get("impl", "impl"),
        impl_version=doc.get("impl_version", ""),
        scenario=doc.get("scenario"),
        failure=failure,
        known_failure=known,
    )


def load_trace(path: str) -> Trace:
    """Read and validate a trace file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(path, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_trace(doc, path)


def save_trace(trace: Trace, directory: str) -> str:
    """Write `trace` under `directory` with its stable name; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, trace.stable_name())
    partial = f"{path}.{os.getpid()}.partial"  # written whole, then renamed: a reader never sees half
    with open(partial, "w", encoding="utf-8") as f:
        f.write(trace.to_json())
    os.replace(partial, path)
    return path


@dataclass
class Verdict:
    """How a replay ended: `failure` is None when every step and every check passed."""

    steps_run: int
    failure: Optional[Failure] = None
    error: Optional[BaseException] = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.failure is None


def failure_trace(driver: Driver, exc: BaseException, scenario: Optional[str] = None) -> Trace:
    """The trace of everything `driver` ran, ending in the failure `exc`."""
    return Trace(
        config=driver.config,
        operations=list(driver.operations),
        scheduler=driver.scheduler,
        protocol=driver.protocol_name,
        set_aside=driver.set_aside.names(),
        impl=driver.cut.name,
        impl_version=driver.cut.release,
        scenario=scenario,
        failure=Failure(check_of(exc), str(exc), len(driver.operations) - 1, driver.signature(exc)),
    )


def scheduler_fault(trace: Trace, version: Optional[str] = None) -> Optional[KnownFinding]:
    """The known finding the trace records, when it is a fault of a release's own scheduler
    recorded under it and affects `version` (any, when None): every SGLang tree core of such a
    release fails it."""
    finding = KNOWN_FINDINGS.get(trace.known_failure.split(":")[0]) if trace.known_failure else None
    if finding is None or not finding.in_scheduler or trace.protocol != "scheduler":
        return None
    return finding if version is None or finding.meets(version) else None


def judge(trace: Trace, verdict: Verdict, impl: Optional[str] = None, version: Optional[str] = None) -> Optional[str]:
    """Why a replay's outcome is wrong for its trace, or None when it is as expected.

    A trace must pass, unless it records a known failure of the cache it was replayed on: then
    it must fail with the check it recorded, and passing means the bug is fixed and the trace
    should be promoted. A known failure belongs to the implementation and version the trace
    names (`impl`, `impl_version`); replayed on any other (`impl`/`version` given and
    different) the trace must pass. A fault of a release's own scheduler, recorded under it,
    belongs to every tree core of every release it affects: there it must fail as the finding
    fails (its check and marks), whichever core shows it.
    """
    finding = scheduler_fault(trace, version)
    any_core = finding is not None and bool(impl and impl.startswith("sglang"))
    foreign = not any_core and ((impl is not None and impl != trace.impl) or (version is not None and version != trace.impl_version))
    if not trace.known_failure or foreign:
        if verdict.ok:
            return None
        return f"failed at step {verdict.failure.step}: {verdict.failure.message}"
    if verdict.ok:
        return (
            f"is marked as a known failure ({trace.known_failure}) but now passes: "
            f"clear known_failure to promote it to a regression test"
        )
    recorded = trace.failure.check if trace.failure else None
    if recorded is not None and verdict.failure.check != recorded:
        return f"fails with {verdict.failure.check}, but the known failure recorded {recorded}"
    recorded_signature = trace.failure.signature if trace.failure else None
    mismatch = recorded_signature is not None and verdict.failure.signature is not None and not recorded_signature.same_as(verdict.failure.signature)
    if mismatch and not (any_core and finding.matches(verdict.failure.signature)):
        return f"fails as {verdict.failure.signature.key}, but the known failure recorded {recorded_signature.key}"
    return None


def recorded_set_aside(trace: Trace) -> SetAside:
    """What the run that recorded `trace` had set aside: its known findings and signatures."""
    return SetAside(
        (KNOWN_FINDINGS[n] for n in trace.set_aside if not is_signature_text(n)),
        signatures=(parse_key(n) for n in trace.set_aside if is_signature_text(n)),
    )


def set_aside_names(names: List[str]) -> List[str]:
    """`--set-aside` arguments with each trace file (`.json`) replaced by the key of the failure
    signature it records; TraceError for an unreadable trace, ValueError for one that records no
    signature."""
    keys = []
    for name in names:
        if name.endswith(".json") and not is_signature_text(name):
            trace = load_trace(name)
            if trace.failure is None or trace.failure.signature is None:
                raise ValueError(f"--set-aside {name}: the trace records no failure signature (it passed, or was written before signatures)")
            name = trace.failure.signature.key
        keys.append(name)
    return keys


def finding_of(trace: Trace, cache_factory: CacheFactory) -> Optional[KnownFinding]:
    """The known finding a failing trace recorded on `cache_factory`'s release is: one its
    signature identifies (`KnownFinding.precise`), else one whose settings the trace has, else
    one whose operations it makes (`KnownFinding.avoids`, asked while replaying it), else None."""
    signature = trace.failure.signature if trace.failure else None
    if signature is None:
        return None
    candidates = candidate_findings(signature, trace.impl_version)
    precise = [f for f in candidates if f.precise]
    if precise or not candidates:
        return precise[0] if precise else None
    for finding in candidates:
        if finding.settings(trace.scheduler) != trace.scheduler:
            return finding
    involved: List[KnownFinding] = []
    ops = trace.operations

    def watch(step: int, entry: Dict[str, Any], driver: Driver) -> None:
        if step + 1 < len(ops):
            following = ops[step + 1]
            involved.extend(f for f in candidates if f not in involved and f.avoids(following["op"], following["args"], driver))

    replay(trace, cache_factory, on_step=watch)
    return involved[0] if involved else None


def replay_protocol(trace: Trace, cache_factory: CacheFactory, protocol: Optional[str] = None) -> str:
    """The protocol a replay runs: the one given, else the trace's on the cache and release that
    recorded it, else the cache's own (a trace from SGLang 0.5.4's scheduler replays on `impl`,
    or on another release, under that cache's own scheduler, which makes the same calls without
    0.5.4's scheduler's mistakes)."""
    if protocol is not None:
        return protocol
    recorder = (trace.impl, trace.impl_version)
    if (cache_name(cache_factory), cache_release(cache_factory)) == recorder:
        return trace.protocol
    return protocol_for(cache_factory, trace.scheduler, trace.config)


def replay(
    trace: Trace,
    cache_factory: CacheFactory = ImplCache,
    device: Optional[str] = None,
    protocol: Optional[str] = None,
    on_step: Optional[Callable[[int, Dict[str, Any], Driver], None]] = None,
    source: str = "<trace>",
    set_aside: Optional[SetAside] = None,
) -> Verdict:
    """Run every operation with every check after it; stop at the first failure. The known
    findings the trace set aside are set aside again, unless `set_aside` says otherwise.

    An operation that does not fit the state (a request id that is not live, say) is a bad
    trace, reported as `TraceError` naming the step, not as a failure of the cache.
    """
    config = trace.config if device is None else replace(trace.config, device=device)
    step, driver = -1, None
    with paused_gc():
        try:
            aside = recorded_set_aside(trace) if set_aside is None else set_aside
            driver = Driver(config, trace.scheduler, cache_factory, replay_protocol(trace, cache_factory, protocol), set_aside=aside)
            driver.check()
            for step, entry in enumerate(trace.operations):
                driver.apply(entry["op"], **entry["args"])
                driver.check()
                if on_step is not None:
                    on_step(step, entry, driver)
        except OperationError as exc:
            raise TraceError(source, exc.detail, step, exc.field) from None
        except Exception as exc:
            signature = driver.signature(exc) if driver is not None else signature_of(exc)
            return Verdict(step + 1, Failure(check_of(exc), str(exc), step, signature), exc)
    return Verdict(len(trace.operations))
