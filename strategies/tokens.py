"""Token sequences that share prefixes often, so matches, partial matches and splits are common.

A *corpus* is the list of sequences the run has used so far (prompts, inserted keys, finished
conversations). New sequences mostly reuse a corpus entry: exactly, cut at a random point and
diverged, or extended (the next turn of a conversation). A small vocabulary makes chance
collisions, and so splits deep inside segments, likely too.

`sharing_prefix(integer, ...)` is the one definition; it takes its randomness from `integer(lo,
hi)`, so Hypothesis (`sharing_prefixes`, a strategy) and the random engine draw the same way.
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

from hypothesis import strategies as st

Tokens = Tuple[int, ...]
Integer = Callable[[int, int], int]

FRESH, REUSE, DIVERGE, EXTEND = range(4)


def fresh(integer: Integer, vocab: int, min_size: int, max_size: int) -> Tokens:
    """Independent tokens from `0..vocab-1`, `min_size..max_size` of them."""
    return tuple(integer(0, vocab - 1) for _ in range(integer(min_size, max_size)))


def sharing_prefix(integer: Integer, corpus: Sequence[Tokens], vocab: int, max_len: int, min_len: int = 1) -> Tokens:
    """A sequence of `min_len..max_len` tokens, usually built from an entry of `corpus`.

    Shrinks (under Hypothesis) towards fresh short sequences, then towards the first entry.
    """
    mode = integer(FRESH, EXTEND) if corpus else FRESH
    if mode == FRESH:
        return fresh(integer, vocab, min_len, max_len)
    base = corpus[integer(0, len(corpus) - 1)]
    if mode == REUSE:
        seq = base
    elif mode == DIVERGE:
        seq = base[: integer(0, len(base))] + fresh(integer, vocab, 0, max_len)
    else:
        seq = base + fresh(integer, vocab, 1, max_len)
    seq = seq[:max_len]
    return seq + fresh(integer, vocab, min_len - len(seq), min_len - len(seq)) if len(seq) < min_len else seq


@st.composite
def sharing_prefixes(draw, corpus: Sequence[Tokens], vocab: int, max_len: int, min_len: int = 1) -> Tokens:
    """Hypothesis strategy for `sharing_prefix`."""
    return sharing_prefix(lambda lo, hi: draw(st.integers(lo, hi)), corpus, vocab, max_len, min_len)


def fresh_tokens(vocab: int, min_size: int, max_size: int) -> st.SearchStrategy[Tokens]:
    """Hypothesis strategy for `fresh`."""
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size).map(tuple)
