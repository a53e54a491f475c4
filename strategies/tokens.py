"""Token sequences that share prefixes often, so matches, partial matches and splits are common.

A *corpus* is the list of sequences the run has used so far (prompts, inserted keys, finished
conversations). New sequences mostly reuse a corpus entry: exactly, cut at a random point and
diverged, or extended (the next turn of a conversation). A small vocabulary makes chance
collisions, and so splits deep inside segments, likely too.

Strategies are built from cached primitives: a state machine draws one on every step, and
building and validating a fresh composite strategy each time would dominate its run time.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence, Tuple

from hypothesis import strategies as st

Tokens = Tuple[int, ...]

FRESH, REUSE, DIVERGE, EXTEND = range(4)


@lru_cache(maxsize=None)
def fresh_tokens(vocab: int, min_size: int, max_size: int) -> st.SearchStrategy[Tokens]:
    """Independent tokens from `0..vocab-1`."""
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size).map(tuple)


@st.composite
def sharing_prefixes(draw, corpus: Sequence[Tokens], vocab: int, max_len: int, min_len: int = 1) -> Tokens:
    """A sequence of `min_len..max_len` tokens, usually built from an entry of `corpus`.

    Shrinks towards fresh short sequences, then towards reusing the first corpus entry.
    """
    mode = draw(st.integers(FRESH, EXTEND)) if corpus else FRESH
    if mode == FRESH:
        return draw(fresh_tokens(vocab, min_len, max_len))
    base = corpus[draw(st.integers(0, len(corpus) - 1))]
    if mode == REUSE:
        seq = base
    elif mode == DIVERGE:
        seq = base[: draw(st.integers(0, len(base)))] + draw(fresh_tokens(vocab, 0, max_len))
    else:
        seq = base + draw(fresh_tokens(vocab, 1, max_len))
    seq = seq[:max_len]
    if len(seq) < min_len:
        seq = seq + draw(fresh_tokens(vocab, min_len - len(seq), min_len - len(seq)))
    return seq
