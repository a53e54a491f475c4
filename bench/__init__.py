"""Benchmarks: commands that print their figures (and write JSON); none is a timed test."""

import json
from typing import Any


def write_json(path: str, data: Any) -> None:
    """Write `data` to `path` as indented JSON ending in a newline (each command's --json)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
