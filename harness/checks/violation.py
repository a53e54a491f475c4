"""`InvariantViolation`: what every check raises, naming itself."""

from __future__ import annotations


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
