"""Digests: what the harness's stand-in forward pass writes, so the checks can tell what a KV slot
or a Mamba state was computed from.

`digests(extra_key, tokens)` gives, for each position i, a 63-bit digest of the whole prefix
`tokens[:i + 1]` in the `extra_key` namespace (a LoRA or cache salt changes the KV, as it does in
serving). A KV slot holds the digest of the prefix up to and including its token; a Mamba state
the digest of every token processed. Distinct prefixes collide with probability about 2**-63 a
pair. `encode` / `decode` spread a digest over a state tensor's elements as its 8 bytes, one byte
an element, so that it is stored exactly in any dtype with 8 bits of mantissa (SGLang keeps conv
states in bfloat16).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Hashable, List, Optional, Sequence

import torch

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
DIGEST_BYTES = 8


@lru_cache(maxsize=None)
def namespace_seed(extra_key: Hashable) -> int:
    """The digest of the empty prefix in `extra_key`'s namespace."""
    return int.from_bytes(hashlib.blake2b(repr(extra_key).encode(), digest_size=8).digest(), "little") & _MASK63


def step(previous: int, token: int) -> int:
    """The digest of a prefix extended by `token` (splitmix64's finaliser over both)."""
    x = (previous ^ ((token + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & _MASK63


def digests(extra_key: Hashable, tokens: Sequence[int], start: Optional[int] = None) -> List[int]:
    """The digest of every prefix `tokens[:i + 1]`; `start` is the digest of what precedes
    `tokens` (default: nothing)."""
    d = namespace_seed(extra_key) if start is None else start
    out = []
    for token in tokens:
        d = step(d, token)
        out.append(d)
    return out


def digest(extra_key: Hashable, tokens: Sequence[int]) -> int:
    """The digest of the whole of `tokens` (of the empty prefix when there are none)."""
    found = digests(extra_key, tokens)
    return found[-1] if found else namespace_seed(extra_key)


def encode(value: int, elements: int) -> List[float]:
    """`value`'s bytes laid over `elements` state elements, repeating (needs at least 8)."""
    if elements < DIGEST_BYTES:
        raise ValueError(f"a state needs at least {DIGEST_BYTES} elements to hold a digest, got {elements}")
    raw = value.to_bytes(DIGEST_BYTES, "little")
    return [float(raw[i % DIGEST_BYTES]) for i in range(elements)]


def decode(elements: Sequence[float]) -> Optional[int]:
    """The digest a state's elements hold, or None when they hold no digest's pattern (a state
    written as anything but one digest, or too short)."""
    n = len(elements)
    if n < DIGEST_BYTES:
        return None
    head = list(elements[:DIGEST_BYTES])
    raw = [int(b) for b in head]
    if head != raw or min(raw) < 0 or max(raw) > 255:
        return None
    if list(elements) != (raw * (n // DIGEST_BYTES + 1))[:n]:
        return None
    return int.from_bytes(bytes(raw), "little")


def state_values(value: int, state: torch.Tensor) -> torch.Tensor:
    """`value` encoded over one slot of `state` (shaped [layers, slots, ...]): a tensor shaped
    like `state[:, 0]`, on its device and in its dtype."""
    per_slot = state[:, 0]
    flat = torch.tensor(encode(value, per_slot[0].numel()), dtype=torch.float32, device="cpu")
    return flat.to(device=state.device, dtype=state.dtype).reshape(per_slot[0].shape).expand(per_slot.shape)
