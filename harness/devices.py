"""The device helpers every command shares: the default device and the check that one is usable."""

from __future__ import annotations

import torch


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
    if kind == "meta":
        raise ValueError(f"--device {device}: a meta tensor holds no data, and the checks read every slot; use cpu or cuda")
