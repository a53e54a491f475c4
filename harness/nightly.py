"""`python -m harness.nightly`: the nightly fuzz of SGLang, the same on a GPU runner and a CPU machine.

One fuzz per target, each in its own process and environment, then one comparison with the last
night's report:

  impl                    this repository's implementation
  sglang-V-python/-rust   the newest release V the harness knows, on both tree cores, from the
                          release store (`harness.releases.store`: its wheel, Rust core included)
  sglang-REF-python/-rust with --sglang-ref (or --sglang-checkout): an SGLang checkout installed
                          editable (`pip install -e python/`, which builds its Rust core) into a
                          virtual environment of its own that sees this one's packages
  NAME=IMPL               (--target) any other `--impl`, a subclass of impl's cache say

Kept between nights under --state: the example database of each target (`db/TARGET`) and the last
report (`last-report.json`). Written under --out (the artifacts): `nightly-report.json`,
`summary.md`, and per target its fuzz report, its shrunk traces and, for SGLang, a reproducer per
trace (`replay --to-script`; where a failure has no standalone form, a `.txt` saying why).

Each failure is keyed by target and signature (`harness.signature`): new since the last night,
still open, or gone. Exit status 0: nothing new and every target ran; 1: something new, or a
target could not run (the summary says why); 2: unusable options.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO

from harness.caches.sglang_releases import RELEASES
from harness.usage import CommandParser

DEFAULT_REPO = "https://github.com/sgl-project/sglang"
CORES = ("python", "rust")
PROJECT = Path(__file__).resolve().parents[1]


@dataclass
class Target:
    """One fuzz of the night: the `--impl` it fuzzes, with which interpreter and environment,
    and what has to happen first (`prepare`: commands, each a list of arguments)."""

    name: str
    impl: str
    python: str = sys.executable
    env: Dict[str, str] = field(default_factory=dict)  # added to this process's environment
    prepare: List[List[str]] = field(default_factory=list)
    sglang: bool = False  # reproducers are written for its traces

    def describe(self) -> str:
        steps = [" ".join(shlex.quote(a) for a in step) for step in self.prepare]
        extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return "; ".join(steps + [f"{extra + ' ' if extra else ''}{self.python} -m harness fuzz --impl {self.impl}"])


def release_targets(version: str, store_root: Optional[str]) -> List[Target]:
    """The release on both tree cores, run from the release store."""
    from harness.releases.store import ReleaseStore

    store = ReleaseStore(store_root)
    env = {"PYTHONPATH": os.pathsep.join([str(store.unpacked(version)), str(PROJECT)]), "SGLANG_MAMBA_SSM_DTYPE": "float32"}
    fetch = [sys.executable, "-m", "harness.releases.store", "--from", version, "--to", version]
    if store_root:
        env["HARNESS_RELEASE_STORE"] = store_root
    return [Target(f"sglang-{version}-{core}", f"sglang-{core}", env=env, prepare=[fetch] if i == 0 else [], sglang=True)
            for i, core in enumerate(CORES)]


def checkout_targets(ref: Optional[str], repo: str, checkout: Optional[str], state: Path) -> List[Target]:
    """An SGLang checkout (cloned at `ref`, or the directory `checkout`), installed editable into
    a virtual environment under `state` that sees this environment's packages (torch, SGLang's
    dependencies), on both tree cores."""
    label = ref or Path(checkout).name
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in label)
    venv = state / f"venv-{safe}"
    source = Path(checkout) if checkout else state / f"sglang-{safe}"
    prepare: List[List[str]] = []
    if checkout is None:
        prepare += [
            ["rm", "-rf", str(source)],
            ["git", "clone", "--quiet", "--filter=blob:none", "--no-checkout", repo, str(source)],
            ["git", "-C", str(source), "fetch", "--quiet", "origin", ref],
            ["git", "-C", str(source), "checkout", "--quiet", "FETCH_HEAD"],
        ]
    python = str(venv / "bin" / "python")
    prepare += [
        [sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(venv)],
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(source / "python")],
    ]
    env = {"PYTHONPATH": str(PROJECT), "SGLANG_MAMBA_SSM_DTYPE": "float32"}
    return [Target(f"sglang-{safe}-{core}", f"sglang-{core}", python=python, env=env, prepare=prepare if i == 0 else [], sglang=True)
            for i, core in enumerate(CORES)]


def targets_of(args: argparse.Namespace, state: Path) -> List[Target]:
    targets = [Target("impl", "impl")] if not args.no_impl else []
    if not args.no_release:
        targets += release_targets(args.release, args.release_store)
    if args.sglang_ref or args.sglang_checkout:
        targets += checkout_targets(args.sglang_ref, args.sglang_repo, args.sglang_checkout, state)
    for extra in args.target:
        name, _, impl = extra.partition("=")
        targets.append(Target(name, impl))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"two targets share a name: {names}")
    return targets


def run_target(target: Target, args: argparse.Namespace, state: Path, out: Path, log: TextIO) -> Dict[str, Any]:
    """Prepare and fuzz one target; its fuzz report (the buckets) or why it could not run."""
    env = dict(os.environ, **target.env)
    here = out / target.name
    here.mkdir(parents=True, exist_ok=True)
    for step in target.prepare:
        done = subprocess.run(step, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"])[-1]
            return {"target": target.name, "status": "cannot run", "why": f"{' '.join(step[:4])}...: {last}"}
    report = here / "report.json"
    command = [target.python, "-m", "harness", "fuzz", "--impl", target.impl, "--seconds", str(args.minutes * 60),
               "--device", args.device, "--db", str(state / "db" / target.name), "--report", str(report),
               "--trace-dir", str(here / "traces")]
    if args.workers:
        command += ["--workers", str(args.workers)]
    log.write(f"nightly: {target.name}: {' '.join(shlex.quote(c) for c in command)}\n")
    log.flush()
    done = subprocess.run(command, env=env, cwd=PROJECT, capture_output=True, text=True)
    (here / "fuzz.log").write_text(done.stdout + done.stderr)
    if done.returncode not in (0, 1) or not report.exists():
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"])[-1]
        return {"target": target.name, "status": "cannot run", "why": last}
    fuzzed = json.loads(report.read_text())
    if target.sglang:
        for bucket in fuzzed["buckets"]:
            bucket["reproducer"] = write_reproducer(target, bucket.get("trace"), here / "reproducers", env)
    return {"target": target.name, "status": "ran", "versions": fuzzed.get("versions", {}),
            "elapsed_seconds": fuzzed["elapsed_seconds"], "programs": fuzzed["programs"], "buckets": fuzzed["buckets"]}


def write_reproducer(target: Target, trace: Optional[str], directory: Path, env: Dict[str, str]) -> Optional[str]:
    """`replay TRACE --to-script` into `directory`: the script's path, or a `.txt` with why not."""
    if not trace:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    stem = Path(trace).name.removesuffix(".json")
    done = subprocess.run([target.python, "-m", "harness", "replay", trace, "--to-script"], env=env, cwd=PROJECT,
                          capture_output=True, text=True)
    if done.returncode == 0:
        path = directory / f"{stem}.py"
        path.write_text(done.stdout)
    else:
        path = directory / f"{stem}.txt"
        path.write_text((done.stderr.strip().splitlines() or ["no reproducer"])[-1] + "\n")
    return str(path)


def compare(tonight: List[Dict[str, Any]], last: Optional[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Tonight's buckets against the last night's, by target and signature: new, still open, gone.
    A target that could not run tonight leaves its last buckets open (nothing is known of them)."""
    def keyed(results: List[Dict[str, Any]]) -> Dict[tuple, Dict[str, Any]]:
        return {(r["target"], b["key"]): dict(b, target=r["target"]) for r in results if r["status"] == "ran" for b in r["buckets"]}

    now = keyed(tonight)
    before = keyed(last["results"]) if last else {}
    ran = {r["target"] for r in tonight if r["status"] == "ran"}
    return {
        "new": [b for k, b in now.items() if k not in before],
        "still_open": [b for k, b in now.items() if k in before],
        "gone": [b for k, b in before.items() if k not in now and k[0] in ran],
    }


def summary(results: List[Dict[str, Any]], changes: Dict[str, List[Dict[str, Any]]], had_last: bool) -> str:
    lines = ["# Nightly fuzz", ""]
    for r in results:
        if r["status"] == "ran":
            lines.append(f"- {r['target']}: {r['programs']} programs in {r['elapsed_seconds']:.0f}s, {len(r['buckets'])} distinct failure(s)")
        else:
            lines.append(f"- {r['target']}: cannot run: {r['why']}")
    titles = {"new": "New since the last night" if had_last else "New (no report from a last night)",
              "still_open": "Still open", "gone": "Gone since the last night"}
    for kind in ("new", "still_open", "gone"):
        lines += ["", f"## {titles[kind]} ({len(changes[kind])})"]
        for b in changes[kind]:
            known = f" (known finding {b['known']})" if b.get("known") else ""
            lines.append(f"- {b['target']}: `{b['key']}`{known}")
            if kind != "gone":
                lines.append(f"  {b['count']} program(s); trace {b.get('trace')}; reproducer {b.get('reproducer') or '-'}")
    return "\n".join(lines) + "\n"


def build_parser() -> CommandParser:
    parser = CommandParser(prog="python -m harness.nightly", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="fuzz budget per target (default 10)")
    parser.add_argument("--device", default="cpu", help="torch device of every fuzz (a GPU runner: cuda)")
    parser.add_argument("--state", required=True, help="kept between nights: example databases, the last report")
    parser.add_argument("--out", required=True, help="the artifacts: reports, traces, reproducers, summary.md")
    parser.add_argument("--workers", type=int, default=None, help="fuzz processes per target (default: one per core)")
    parser.add_argument("--release", default=RELEASES[-1], help=f"the release fuzzed on both cores (default {RELEASES[-1]})")
    parser.add_argument("--release-store", default=None, help="the release store (default $HARNESS_RELEASE_STORE or ~/.cache)")
    parser.add_argument("--no-release", action="store_true", help="fuzz no release")
    parser.add_argument("--no-impl", action="store_true", help="do not fuzz impl")
    parser.add_argument("--sglang-ref", default=None, help="an SGLang git ref (branch, tag, commit) to clone, install and fuzz")
    parser.add_argument("--sglang-repo", default=DEFAULT_REPO, help=f"the repository of --sglang-ref (default {DEFAULT_REPO})")
    parser.add_argument("--sglang-checkout", default=None, help="an SGLang checkout to install and fuzz instead of cloning a ref")
    parser.add_argument("--target", action="append", default=[], metavar="NAME=IMPL", help="another --impl to fuzz (repeatable)")
    parser.add_argument("--plan", action="store_true", help="print what each target runs, and stop")
    return parser


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    state, artifacts = Path(args.state), Path(args.out)
    problem = None
    if not (args.minutes > 0):
        problem = f"--minutes must be positive, got {args.minutes}"
    elif args.sglang_ref and args.sglang_checkout:
        problem = "give --sglang-ref or --sglang-checkout, not both"
    elif args.sglang_checkout and not (Path(args.sglang_checkout) / "python").is_dir():
        problem = f"--sglang-checkout {args.sglang_checkout}: not an SGLang checkout (no python/ directory)"
    elif any("=" not in t or not t.partition("=")[0] or not t.partition("=")[2] for t in args.target):
        problem = f"--target must be NAME=IMPL, got {[t for t in args.target if '=' not in t][:1] or args.target}"
    elif args.release not in RELEASES:
        problem = f"--release {args.release}: not a release the harness knows ({RELEASES[0]} .. {RELEASES[-1]})"
    if problem is None:
        try:
            targets = targets_of(args, state)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.plan:
        for t in targets:
            out.write(f"{t.name}: {t.describe()}\n")
        return 0
    state.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    last_path = state / "last-report.json"
    last = json.loads(last_path.read_text()) if last_path.exists() else None
    results = [run_target(t, args, state, artifacts, out) for t in targets]
    changes = compare(results, last)
    report = {"results": results, "changes": changes, "last_night": str(last_path) if last else None}
    (artifacts / "nightly-report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    text = summary(results, changes, last is not None)
    (artifacts / "summary.md").write_text(text)
    out.write(text)
    # a target that could not run tonight keeps its last night's failures for the next comparison
    kept = [r for r in (last or {}).get("results", []) if r["target"] in {f["target"] for f in results if f["status"] != "ran"}]
    last_path.write_text(json.dumps({"results": [r for r in results if r["status"] == "ran"] + kept}, indent=1, sort_keys=True) + "\n")
    failed = [r for r in results if r["status"] != "ran"]
    return 1 if changes["new"] or failed else 0


if __name__ == "__main__":
    sys.exit(main())
