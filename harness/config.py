"""`CacheConfig`: the sizes and device one harness run builds its cache and pools with; the
device helpers every command shares (`best_device`, `check_device`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheConfig:
    """Pool sizes, device and page size (always 1) for a cache under test."""

    kv_size: int
    mamba_size: int
    req_size: int
    max_context_len: int = 256
    device: str = "cpu"
    page_size: int = 1

    def __post_init__(self):
        if self.page_size != 1:
            raise ValueError(f"CacheConfig.page_size must be 1 (the only size supported), got {self.page_size!r}")
        for name in ("kv_size", "mamba_size", "req_size", "max_context_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CacheConfig.{name} must be a positive int, got {value!r}")


def best_device() -> str:
    """The device commands default to: `cuda` when it is available, else `cpu`."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> None:
    """Raise ValueError naming `device` unless it is a torch device usable on this machine."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"--device: not a torch device: {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine")
