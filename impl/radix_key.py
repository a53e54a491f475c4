"""`RadixKey`: the token ids of a request plus an optional namespace (`extra_key`).

Keys with different extra keys never share nodes: the child key of a node includes the extra key.
"""

from __future__ import annotations

import operator
from typing import Hashable, Iterator, Optional, Sequence, Union

from impl.errors import CacheMisuseError


_PLAIN_INT = {int}


def _as_token_list(token_ids: Sequence[int]) -> list[int]:
    try:
        items = list(token_ids)
    except TypeError:
        raise CacheMisuseError(
            f"RadixKey token_ids must be a sequence of ints, got {token_ids!r}"
        ) from None
    tokens = items if set(map(type, items)) <= _PLAIN_INT else [_as_token(t, i) for i, t in enumerate(items)]
    if tokens and min(tokens) < 0:
        position = next(i for i, token in enumerate(tokens) if token < 0)
        raise CacheMisuseError(f"RadixKey token {items[position]!r} at position {position} is negative")
    return tokens


def _as_token(token: object, position: int) -> int:
    if isinstance(token, bool):
        raise CacheMisuseError(
            f"RadixKey token {token!r} at position {position} is a bool, not a token id"
        )
    try:
        return operator.index(token)
    except TypeError:
        raise CacheMisuseError(
            f"RadixKey token {token!r} at position {position} is not an integer"
        ) from None


class RadixKey:
    """Token ids with an optional `extra_key` namespace; slicing keeps the namespace.

    Construction validates that every token is a non-negative integer and that `extra_key` is
    hashable (`CacheMisuseError` otherwise).
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: Optional[Hashable] = None):
        self.token_ids = _as_token_list(token_ids)
        try:
            hash(extra_key)
        except TypeError:
            raise CacheMisuseError(f"RadixKey extra_key must be hashable, got {extra_key!r}") from None
        self.extra_key = extra_key

    @classmethod
    def _trusted(cls, token_ids: list[int], extra_key: Optional[Hashable]) -> "RadixKey":
        key = cls.__new__(cls)
        key.token_ids = token_ids
        key.extra_key = extra_key
        return key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids)

    def __getitem__(self, idx: Union[int, slice]) -> "RadixKey":
        if isinstance(idx, slice):
            return RadixKey._trusted(self.token_ids[idx], self.extra_key)
        return RadixKey._trusted([self.token_ids[idx]], self.extra_key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return self.token_ids == other.token_ids and self.extra_key == other.extra_key

    def __hash__(self) -> int:
        return hash((tuple(self.token_ids), self.extra_key))

    def __repr__(self) -> str:
        preview = self.token_ids[:10]
        more = "..." if len(self.token_ids) > 10 else ""
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={preview}{more})"


def child_key(key: RadixKey, page_size: int = 1) -> Hashable:
    """The dict key under which a node whose segment starts with `key` hangs off its parent: its
    first token (its first page's tokens when paged), with the extra key if it has one."""
    return child_key_at(key.token_ids, 0, key.extra_key, page_size)


def child_key_at(tokens: list[int], pos: int, extra_key: Optional[Hashable], page_size: int = 1) -> Hashable:
    """`child_key` of the key `tokens[pos:]` (with `extra_key`), without slicing it."""
    first = tokens[pos] if page_size == 1 else tuple(tokens[pos : pos + page_size])
    return first if extra_key is None else (extra_key, first)


def shared_pages(segment: list[int], tokens: list[int], start: int, page_size: int) -> int:
    """Number of leading tokens `segment` shares with `tokens[start:]`, in whole pages."""
    n = shared_length(segment, tokens, start)
    return n if page_size == 1 else n - n % page_size


def shared_length(segment: list[int], tokens: list[int], start: int) -> int:
    """Number of leading tokens `segment` shares with `tokens[start:]`."""
    n = min(len(segment), len(tokens) - start)
    if (segment if n == len(segment) else segment[:n]) == tokens[start : start + n]:
        return n  # (a whole segment is compared as it is, not copied first)
    # the first mismatch, by bisection over prefix equality: O(log n) list comparisons in C
    # instead of one Python-level comparison a token
    lo, hi = 0, n - 1  # segment[:lo] matches, and the first mismatch is at most hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if segment[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
