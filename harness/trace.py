"""Trace files: a failing (or interesting) run as a replayable, versioned JSON document.

A trace holds the configuration, the operations in the harness's vocabulary
(`harness.operations`), the failure they produced and, for a bug recorded before it is fixed,
a `known_failure` reason. `replay` runs one against any adapter with every invariant checked
after every step. The format is documented in the README ("Trace files").
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional

from harness.adapters import ImplAdapter
from harness.config import CacheConfig
from harness.driver import Divergence, PairedScheduler
from harness.invariants import InvariantViolation
from harness.operations import OperationError, check_arguments

SCHEMA = "mamba-radix-cache-trace"
VERSION = 1
_TOP_FIELDS = {"schema", "version", "config", "impl", "impl_version", "scenario", "operations", "failure", "known_failure"}


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


@dataclass
class Trace:
    config: CacheConfig
    operations: List[Dict[str, Any]]
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
            "impl": self.impl,
            "impl_version": self.impl_version,
            "scenario": self.scenario,
            "operations": self.operations,
            "failure": None if self.failure is None else asdict(self.failure),
            "known_failure": self.known_failure,
        }
        return json.dumps(doc, sort_keys=True, indent=1) + "\n"

    def stable_name(self) -> str:
        """A file name derived from the failure and the operations."""
        digest = hashlib.sha256(json.dumps(self.operations, sort_keys=True).encode()).hexdigest()[:12]
        check = self.failure.check if self.failure else "passing"
        return f"{check}-{len(self.operations)}ops-{digest}.json"


def classify(exc: BaseException) -> str:
    """The check a failure belongs to: an invariant's name, `model_agreement`, or the error type."""
    if isinstance(exc, InvariantViolation):
        return exc.check
    if isinstance(exc, Divergence):
        return "model_agreement"
    return type(exc).__name__


def _require(source: str, cond: bool, message: str, step: Optional[int] = None, field_name: Optional[str] = None):
    if not cond:
        raise TraceError(source, message, step, field_name)


def parse_trace(doc: Any, source: str = "<trace>") -> Trace:
    """Validate a decoded trace document; `TraceError` names the first bad field."""
    _require(source, isinstance(doc, dict), f"expected a JSON object, got {type(doc).__name__}")
    _require(source, doc.get("schema") == SCHEMA, f"expected {SCHEMA!r}, got {doc.get('schema')!r}", field_name="schema")
    version = doc.get("version")
    _require(source, isinstance(version, int) and not isinstance(version, bool), f"expected an int, got {version!r}", field_name="version")
    _require(source, version <= VERSION, f"version {version} is newer than this harness reads ({VERSION}); upgrade the harness", field_name="version")
    unknown = sorted(set(doc) - _TOP_FIELDS)
    _require(source, not unknown, "unknown field", field_name=unknown[0] if unknown else None)
    config = doc.get("config")
    _require(source, isinstance(config, dict), f"expected an object, got {config!r}", field_name="config")
    try:
        cache_config = CacheConfig(**config)
    except (TypeError, ValueError) as exc:
        raise TraceError(source, str(exc), field_name="config") from None
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
        _require(source, isinstance(failure, dict) and set(failure) == {"check", "message", "step"}, f"expected check, message, step; got {failure!r}", field_name="failure")
        failure = Failure(**failure)
    known = doc.get("known_failure")
    _require(source, known is None or isinstance(known, str), f"expected null or a reason, got {known!r}", field_name="known_failure")
    for name in ("impl", "impl_version"):
        _require(source, isinstance(doc.get(name, ""), str), f"expected a string, got {doc.get(name)!r}", field_name=name)
    return Trace(
        config=cache_config,
        operations=operations,
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
    with open(path, "w", encoding="utf-8") as f:
        f.write(trace.to_json())
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


def failure_trace(driver: PairedScheduler, exc: BaseException, scenario: Optional[str] = None) -> Trace:
    """The trace of everything `driver` ran, ending in the failure `exc`."""
    return Trace(
        config=driver.config,
        operations=list(driver.operations),
        impl=getattr(driver.adapter, "name", "impl"),
        impl_version=driver.adapter.version(),
        scenario=scenario,
        failure=Failure(classify(exc), str(exc), len(driver.operations) - 1),
    )


def judge(trace: Trace, verdict: Verdict, impl: Optional[str] = None, version: Optional[str] = None) -> Optional[str]:
    """Why a replay's outcome is wrong for its trace, or None when it is as expected.

    A trace must pass, unless it records a known failure of the cache it was replayed on: then
    it must fail with the check it recorded, and passing means the bug is fixed and the trace
    should be promoted. A known failure belongs to the implementation and version the trace
    names (`impl`, `impl_version`); replayed on any other (`impl`/`version` given and
    different) the trace must pass.
    """
    foreign = (impl is not None and impl != trace.impl) or (version is not None and version != trace.impl_version)
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
    return None


def replay(
    trace: Trace,
    adapter_factory: Callable[[CacheConfig], Any] = ImplAdapter,
    device: Optional[str] = None,
    on_step: Optional[Callable[[int, Dict[str, Any], PairedScheduler], None]] = None,
    source: str = "<trace>",
) -> Verdict:
    """Run every operation with every invariant checked after it; stop at the first failure.

    An operation that does not fit the state (a request id that is not live, say) is a bad
    trace, reported as `TraceError` naming the step, not as a failure of the implementation.
    """
    config = trace.config if device is None else replace(trace.config, device=device)
    driver = PairedScheduler(config, adapter_factory)
    step = -1
    try:
        driver.check()
        for step, entry in enumerate(trace.operations):
            driver.apply(entry["op"], **entry["args"])
            driver.check()
            if on_step is not None:
                on_step(step, entry, driver)
    except OperationError as exc:
        raise TraceError(source, exc.detail, step, exc.field) from None
    except Exception as exc:
        return Verdict(step + 1, Failure(classify(exc), str(exc), step), exc)
    return Verdict(len(trace.operations))
