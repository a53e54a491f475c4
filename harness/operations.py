"""The harness's operation vocabulary: every operation a trace can hold, with its arguments.

Scheduler events (every protocol): `arrive`, `iterate`, `abort`, `flush`. Direct API calls
(the contract protocol only, see `harness.protocols.direct_api`): `insert`, `match`, `lock`,
`unlock`, `unlock_unlocked`, `lock_evicted`, `evict`, `evict_mamba`, `cow_match`, `req_slots`.

`OPERATIONS[name]` maps each argument to its kind. `check_arguments` validates one recorded
operation and names the offending field; the driver records and replays operations through it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

TOKENS, NONEMPTY_TOKENS, COUNT, FLAG, EXTRA_KEY = "tokens", "nonempty tokens", "count", "flag", "extra key"

OPERATIONS: Dict[str, Dict[str, str]] = {
    "arrive": {"tokens": NONEMPTY_TOKENS, "extra_key": EXTRA_KEY, "max_new_tokens": COUNT},
    "iterate": {"tokens": TOKENS, "transferred": COUNT},
    "abort": {"rid": COUNT},
    "flush": {},
    "insert": {"tokens": NONEMPTY_TOKENS, "extra_key": EXTRA_KEY},
    "match": {"tokens": TOKENS, "extra_key": EXTRA_KEY},
    "lock": {"tokens": NONEMPTY_TOKENS, "extra_key": EXTRA_KEY},
    "unlock": {"index": COUNT},
    "unlock_unlocked": {"tokens": NONEMPTY_TOKENS, "extra_key": EXTRA_KEY},
    "lock_evicted": {"index": COUNT},
    "evict": {"num_tokens": COUNT},
    "evict_mamba": {"num": COUNT},
    "cow_match": {"tokens": NONEMPTY_TOKENS, "extra_key": EXTRA_KEY, "own_slot": FLAG},
    "req_slots": {"count": COUNT},
}


def sampled_token(tokens: Sequence[int], i: int) -> int:
    """The token the forward pass samples for the i-th request of a batch, from an `iterate`'s
    `tokens` (0 when there are none)."""
    return tokens[i % len(tokens)] if tokens else 0


class OperationError(ValueError):
    """A recorded operation is malformed; `field` names what is wrong."""

    def __init__(self, field: str, detail: str):
        super().__init__(f"field {field!r}: {detail}")
        self.field = field
        self.detail = detail


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_value(field: str, kind: str, value: Any) -> None:
    if kind in (TOKENS, NONEMPTY_TOKENS):
        if not isinstance(value, list) or not all(_is_count(t) for t in value):
            raise OperationError(field, f"expected a list of non-negative ints, got {value!r}")
        if kind == NONEMPTY_TOKENS and not value:
            raise OperationError(field, "expected at least one token, got []")
    elif kind == COUNT:
        if not _is_count(value):
            raise OperationError(field, f"expected a non-negative int, got {value!r}")
    elif kind == FLAG:
        if not isinstance(value, bool):
            raise OperationError(field, f"expected true or false, got {value!r}")
    elif kind == EXTRA_KEY:
        if value is not None and not isinstance(value, str):
            raise OperationError(field, f"expected null or a string, got {value!r}")


def check_arguments(op: Any, args: Any) -> None:
    """Raise `OperationError` unless `op` is known and `args` are exactly its arguments."""
    if op not in OPERATIONS:
        raise OperationError("op", f"unknown operation {op!r}; known: {sorted(OPERATIONS)}")
    if not isinstance(args, Mapping):
        raise OperationError("args", f"expected an object of arguments, got {args!r}")
    schema = OPERATIONS[op]
    missing = sorted(set(schema) - set(args))
    if missing:
        raise OperationError(f"args.{missing[0]}", f"{op} needs argument {missing[0]!r}")
    unknown = sorted(set(args) - set(schema))
    if unknown:
        raise OperationError(f"args.{unknown[0]}", f"{op} takes no argument {unknown[0]!r}")
    for name, kind in schema.items():
        _check_value(f"args.{name}", kind, args[name])
