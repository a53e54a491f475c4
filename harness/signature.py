"""Failure signatures: when two failures are the same bug.

A failure's `Signature` has four parts, all in words that stay the same from one program to the
next (numbers in them are written `N`):

  check   the check that broke (an invariant's name, `model_agreement` for a return value the
          model disagrees with), or the type of the exception raised (by SGLang, by the
          harness's adapter, or by the release's scheduler as a protocol transcribes it)
  what    an invariant: the kind of instance the check found wrong (`InvariantViolation.what`:
          "Mamba slot viewing a pool's free list", "KV slot leaked"); a disagreement: what
          differed ("request N's Mamba slot"); an exception: the first line of its message
  where   the call it failed in: the cache or pool call the scheduler made
          (`harness.pairing.sglang_call` names them: "tree_cache.cache_finished_req"), or, for an
          exception the scheduler itself raises, "scheduler.FUNCTION"; an invariant checked after
          a step failed after it: "after OP" (the operation, and the last call it made)
  frame   for an exception raised inside SGLang: its innermost SGLang frame, "module:function"

Identity (`Signature.key`): an invariant is identified by its check and what alone. A check
cannot tell which call made the state it finds wrong, and the checks that can go on past a failure
(`harness.checks.TOLERABLE_CHECKS`) pass over every instance of that kind once it is set aside.
Every other failure ends its program where it happens, and all four parts identify it. The key is
one line, the parts joined by " | "; `--set-aside` takes it back (`parse_key`).
"""

from __future__ import annotations

import re
import types
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from harness.checks.violation import InvariantViolation
from harness.pairing import Divergence, ReleaseRaised

SEPARATOR = " | "
INVARIANT, DIVERGENCE, EXCEPTION = "invariant", "divergence", "exception"
MAX_WHAT = 160


@dataclass(frozen=True)
class Signature:
    """What identifies a failure (see the module docstring)."""

    kind: str  # INVARIANT, DIVERGENCE or EXCEPTION
    check: str
    what: str
    where: str = ""
    frame: Optional[str] = None

    @property
    def key(self) -> str:
        """The identity, one line: `check | what` for an invariant, else every part."""
        parts = [self.check, self.what] if self.kind == INVARIANT else [self.check, self.what, self.where, self.frame or "-"]
        return SEPARATOR.join(parts)

    def same_as(self, other: "Signature") -> bool:
        return self.key == other.key

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> "Signature":
        """ValueError naming what is wrong with a signature's JSON object."""
        if not isinstance(doc, dict) or not {"kind", "check", "what"} <= set(doc) or not set(doc) <= {"kind", "check", "what", "where", "frame"}:
            raise ValueError(f"expected a signature object (kind, check, what, where, frame), got {doc!r}")
        if doc["kind"] not in (INVARIANT, DIVERGENCE, EXCEPTION):
            raise ValueError(f"signature kind must be {INVARIANT}, {DIVERGENCE} or {EXCEPTION}, got {doc['kind']!r}")
        return cls(**doc)


def parse_key(text: str) -> Signature:
    """A signature from its key (`Signature.key`); ValueError naming what does not parse."""
    parts = text.split(SEPARATOR)
    if len(parts) == 2 and all(parts):
        return Signature(INVARIANT, parts[0], parts[1])
    if len(parts) == 4 and all(parts[:2]) and parts[3]:  # a failure outside any call has no `where`
        check, what, where, frame = parts
        kind = DIVERGENCE if check == "model_agreement" else EXCEPTION
        return Signature(kind, check, what, where, None if frame == "-" else frame)
    raise ValueError(
        f"not a failure signature: {text!r} (expected 'check | what' or 'check | what | where | frame', as a fuzz report prints it)"
    )


def normalize(text: str) -> str:
    """`text`'s first line, numbers written N (a run of them, or a list of one, N...), at most
    MAX_WHAT characters."""
    line = (text.strip().splitlines() or [""])[0]
    line = re.sub(r"\b\d+(\.\d+)*\b", "N", line)  # not the digits of a name (torch.int32)
    line = re.sub(r"N(, N)+", "N...", line).replace("[N]", "[N...]").replace("(N)", "(N...)")
    line = line.replace(SEPARATOR, " / ")
    return line[:MAX_WHAT]


def check_of(exc: BaseException) -> str:
    """The check a failure belongs to: an invariant's name, `model_agreement`, the exception type
    the release's scheduler raises, or the error type the cache raised."""
    if isinstance(exc, InvariantViolation):
        return exc.check
    if isinstance(exc, Divergence):
        return "model_agreement"
    if isinstance(exc, ReleaseRaised):
        return exc.kind
    return type(exc).__name__


def signature_of(exc: BaseException, step: Optional[str] = None) -> Signature:
    """The signature of failure `exc`. `step` says where a check run between operations failed:
    after which operation, and the last call it made (None: before the first operation)."""
    check = check_of(exc)
    call = getattr(exc, "sglang_call", None)
    if isinstance(exc, InvariantViolation):
        where = f"in {call}" if call else (f"after {step}" if step else "before the first operation")
        return Signature(INVARIANT, check, normalize(exc.what), where)
    if isinstance(exc, Divergence):
        return Signature(DIVERGENCE, check, normalize(exc.what), call or "")
    cause = exc.__cause__ if isinstance(exc, ReleaseRaised) and exc.__cause__ is not None else exc
    message = exc.message if isinstance(exc, ReleaseRaised) else str(exc)
    frames = _frames(cause.__traceback__)
    where = getattr(cause, "sglang_call", None) or _scheduler_site(frames) or "the harness"
    return Signature(EXCEPTION, check, normalize(message) or type(exc).__name__, where, _innermost_sglang(frames))


def _frames(tb: Optional[types.TracebackType]) -> List[types.FrameType]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _module(frame: types.FrameType) -> str:
    return frame.f_globals.get("__name__", "")


def _qualname(frame: types.FrameType) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


def _innermost_sglang(frames: List[types.FrameType]) -> Optional[str]:
    inside = [f for f in frames if _module(f) == "sglang" or _module(f).startswith("sglang.")]
    return f"{_module(inside[-1])}:{_qualname(inside[-1])}" if inside else None


def _scheduler_site(frames: List[types.FrameType]) -> Optional[str]:
    """`scheduler.FUNCTION` for the innermost frame of a scheduler protocol (the release's
    scheduler, transcribed, raised there)."""
    inside = [f for f in frames if _module(f).startswith("harness.protocols.")]
    return f"scheduler.{inside[-1].f_code.co_name}" if inside else None
