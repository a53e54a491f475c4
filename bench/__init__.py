"""Benchmarks: commands that print their figures (and write JSON); none is a timed test."""

import argparse
import json
from typing import Any, Iterable, List, Optional, Sequence


def write_json(path: str, data: Any) -> None:
    """Write `data` to `path` as indented JSON ending in a newline (each command's --json)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def markdown_table(header: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table: `align` has one letter per column, `l` or `r`; None prints as `-`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |")
    return "\n".join(lines)


def parse_with_device(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """Parse `argv` with each benchmark's `--device` option added (default cuda when available,
    else cpu); a device this machine cannot use, or a `--json` file that cannot be written, is a
    usage error naming it (exit status 2), found before any work starts."""
    from harness.devices import best_device, check_device

    parser.add_argument("--device", default=best_device(), help="torch device (default cuda when available, else cpu)")
    args = parser.parse_args(argv)
    try:
        check_device(args.device)
        check_json(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def check_json(args: argparse.Namespace) -> None:
    """Raise ValueError unless the command's `--json` file (if any) can be written."""
    from harness.outputs import check_output_file

    if getattr(args, "json", None):
        check_output_file("--json", args.json)
