"""Summarise a finished `mutmut run` over `impl/`: the score and every mutant that was not killed.

    mutmut run && python -m bench.mutation_report [--only PATTERN ...] [--out docs/mutation-survivors.md]
                                                  [--json FILE]

Reads mutmut's own result files under `mutants/` (through mutmut's API) and sorts each mutant
that was not killed into a kind, from its diff:
  message      only the text of a string changed (error messages, labels)
  default      a parameter's default value changed (the harness always passes every argument)
  validation   the guard of a `raise` changed: bad input the driver never sends
  not reached  no state-machine test runs the function
  behaviour    anything else: each one is judged by hand in docs/mutation.md
Prints the counts and writes the list, one line per mutant with its diff, as Markdown.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections import Counter
from typing import Dict, List, Optional, Tuple

from bench import check_json, write_json
from harness.outputs import check_output_file
from harness.usage import CommandParser

_STRING = re.compile(r"""[rbfu]*("([^"\\]|\\.)*"|'([^'\\]|\\.)*')""")
KINDS = ("behaviour", "validation", "message", "default", "not reached")


def _without_strings(line: str) -> str:
    return _STRING.sub('""', line).replace("None", '""').strip()


def changed_lines(diff: str) -> Tuple[List[str], List[str], List[str]]:
    """The removed lines, the added lines and the original function's lines, from a unified diff."""
    removed, added, original = [], [], []
    for line in diff.splitlines()[2:]:
        if line.startswith("@@"):
            continue
        if line.startswith("-"):
            removed.append(line[1:])
            original.append(line[1:])
        elif line.startswith("+"):
            added.append(line[1:])
        else:
            original.append(line[1:])
    return removed, added, original


def kind_of(status: str, diff: str) -> str:
    """Which kind of survivor a mutant is (see the module docstring)."""
    if status == "no tests":
        return "not reached"
    removed, added, original = changed_lines(diff)
    if not removed or not added:
        return "behaviour"
    old, new = removed[0], added[0]
    position = original.index(old)
    start = next((i for i, line in enumerate(original) if line.lstrip().startswith("def ")), None)
    end = None
    if start is not None:  # the diff's context reaches the signature (or the start of it)
        end = next((i for i, line in enumerate(original[start:], start) if line.rstrip().endswith(":")), None)
    if end is not None:
        if start <= position <= end and "=" in old:
            return "default"
    if _without_strings(old) == _without_strings(new):
        return "message"
    following = [line.strip() for line in original[position + 1 :] if line.strip()]
    if old.strip().startswith(("if ", "or ", "and ")) and following and following[0].startswith("raise "):
        return "validation"
    if old.strip().startswith("raise "):
        return "message"
    return "behaviour"


def collect(only: Optional[List[str]] = None) -> List[Dict[str, str]]:
    """Every mutant mutmut made (or those matching a pattern of `only`), with its status, and
    its kind and diff unless killed."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    rows = []
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in sorted(data.exit_code_by_key.items()):
            if only and not any(fnmatch.fnmatchcase(name, pattern) for pattern in only):
                continue
            status = status_by_exit_code[code]
            row = {"mutant": name, "status": status}
            if status not in ("killed", "timeout"):
                diff = get_diff_for_mutant(name, path=path)
                row["kind"] = kind_of(status, diff)
                removed, added, _ = changed_lines(diff)
                row["change"] = f"{removed[0].strip() if removed else ''}  ->  {added[0].strip() if added else ''}"
            rows.append(row)
    return rows


def summary(rows: List[Dict[str, str]]) -> Dict[str, object]:
    statuses = Counter(r["status"] for r in rows)
    killed = statuses["killed"] + statuses["timeout"]
    kinds = Counter(r["kind"] for r in rows if "kind" in r)
    return {
        "mutants": len(rows),
        "killed": killed,
        "statuses": dict(statuses),
        "score": round(killed / len(rows), 4) if rows else None,
        "not_killed_by_kind": {k: kinds[k] for k in KINDS},
    }


def markdown(rows: List[Dict[str, str]], totals: Dict[str, object]) -> str:
    lines = [
        "# mutmut survivors over `impl/` (generated by `python -m bench.mutation_report`)",
        "",
        f"{totals['killed']} of {totals['mutants']} mutants killed (score {totals['score']:.1%}); "
        f"statuses: {totals['statuses']}. Kinds of the others: {totals['not_killed_by_kind']}.",
        "How each kind is judged: `docs/mutation.md`.",
    ]
    for kind in KINDS:
        chosen = [r for r in rows if r.get("kind") == kind]
        if not chosen:
            continue
        lines += ["", f"## {kind} ({len(chosen)})", "", "| mutant | status | change |", "|---|---|---|"]
        for r in chosen:
            change = r["change"].replace("|", "\\|")
            lines.append(f"| `{r['mutant']}` | {r['status']} | `{change}` |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog="python -m bench.mutation_report", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/mutation-survivors.md", help="the Markdown list (default docs/mutation-survivors.md)")
    parser.add_argument("--only", nargs="+", metavar="PATTERN", help="only mutants whose names match (fnmatch)")
    parser.add_argument("--json", help="also write every mutant's status (and kind) to this file")
    args = parser.parse_args(argv)
    try:
        check_output_file("--out", args.out)
        check_json(args)
    except ValueError as exc:
        parser.error(str(exc))
    rows = collect(args.only)
    if not rows:
        parser.error("no mutmut results under mutants/: run `mutmut run` first")
    totals = summary(rows)
    print(json.dumps(totals, indent=1))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(markdown(rows, totals))
    if args.json:
        write_json(args.json, {"summary": totals, "mutants": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
