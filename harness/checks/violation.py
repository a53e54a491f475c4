"""`InvariantViolation`: what every check raises, naming itself and the kind of thing that broke;
`Tolerate`: how a check asks whether that kind of failure is set aside.

`what` is the kind of instance a check found wrong, in words that stay the same from one program
to the next (no slot numbers, no paths: "Mamba slot viewing a pool's free list", "KV slot
leaked"). With the check's name it is the failure's identity (`harness.signature`): a check that
can go on past a failure (`harness.checks.TOLERABLE_CHECKS`) asks `tolerate(check, what)` before
it raises, and passes over that instance when a known finding or an earlier failure of the same
run set it aside.
"""

from __future__ import annotations

from typing import Callable

# `tolerate(check, what)`: whether this kind of failure is set aside (see `harness.findings`);
# by default nothing is
Tolerate = Callable[[str, str], bool]


def never(check: str, what: str) -> bool:
    return False


class InvariantViolation(AssertionError):
    """An invariant did not hold; `check` names it, `what` the kind of instance that broke it."""

    def __init__(self, check: str, message: str, what: str):
        super().__init__(f"[{check}] {message}")
        self.check = check
        self.message = message
        self.what = what


def fail(check: str, what: str, message: str) -> None:
    raise InvariantViolation(check, message, what)


def show_path(path) -> str:
    extra, tokens = path
    return f"{list(tokens)}" if extra is None else f"{extra!r}:{list(tokens)}"
