"""`InvariantViolation`: what every check raises, naming itself; `Tolerate`: how a check asks
whether a known finding is set aside."""

from __future__ import annotations

from typing import Callable

# `tolerate(check, what)`: whether a known finding is set aside for this instance (see
# `harness.findings`); by default nothing is
Tolerate = Callable[[str, str], bool]


def never(check: str, what: str) -> bool:
    return False


class InvariantViolation(AssertionError):
    """An invariant did not hold; `check` names it."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check
        self.message = message


def fail(check: str, message: str) -> None:
    raise InvariantViolation(check, message)


def show_path(path) -> str:
    extra, tokens = path
    return f"{list(tokens)}" if extra is None else f"{extra!r}:{list(tokens)}"
