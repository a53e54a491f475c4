"""`RadixKey`: the token ids of a request plus an optional namespace (`extra_key`).

Keys with different extra keys never share nodes: the child key of a node includes the extra key.
"""

from __future__ import annotations

import operator
from typing import Hashable, Iterator, Optional, Sequence, Union

from impl.errors import CacheMisuseError


def _as_token_list(token_ids: Sequence[int]) -> list[int]:
    try:
        items = list(token_ids)
    except TypeError:
        raise CacheMisuseError(
            f"RadixKey token_ids must be a sequence of ints, got {token_ids!r}"
        ) from None
    tokens = []
    for position, token in enumerate(items):
        if isinstance(token, bool):
            raise CacheMisuseError(
                f"RadixKey token {token!r} at position {position} is a bool, not a token id"
            )
        try:
            tokens.append(operator.index(token))
        except TypeError:
            raise CacheMisuseError(
                f"RadixKey token {token!r} at position {position} is not an integer"
            ) from None
    return tokens


class RadixKey:
    """Token ids with an optional `extra_key` namespace; slicing keeps the namespace.

    Construction validates that every token is an integer (`CacheMisuseError` otherwise).
    """

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: Optional[Hashable] = None):
        self.token_ids = _as_token_list(token_ids)
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


def child_key(key: RadixKey) -> Hashable:
    """The dict key under which a node whose segment starts with `key` hangs off its parent."""
    first = key.token_ids[0]
    return first if key.extra_key is None else (key.extra_key, first)


def match_length(segment: RadixKey, key: RadixKey) -> int:
    """Number of leading tokens `segment` and `key` share (page size 1)."""
    if segment.extra_key != key.extra_key:
        raise CacheMisuseError(
            f"cannot match keys of different extra keys: {segment.extra_key!r} != {key.extra_key!r}"
        )
    length = 0
    for a, b in zip(segment.token_ids, key.token_ids):
        if a != b:
            break
        length += 1
    return length
