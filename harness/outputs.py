"""Checks, made before any work starts, that a command can write where it was told to."""

from __future__ import annotations

import os


def check_output_file(option: str, path: str) -> None:
    """Raise ValueError naming `option` and `path` unless a file can be written at `path`: an
    existing directory, or a parent directory that is missing or not writable, is refused."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{option} {path}: the directory {parent} is not writable")


def check_output_dir(option: str, path: str) -> None:
    """Create the directory `path` if it is missing; raise ValueError naming `option` and `path`
    when it cannot be created or written."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot create it ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: not writable")
