"""The release store: every SGLang release's wheel, fetched once and unpacked outside the checkout.

  ROOT/wheels/sglang-VERSION-*.whl     what `pip download --no-deps sglang==VERSION` fetched
  ROOT/unpacked/VERSION/sglang/...     the wheel unpacked (with its .dist-info): the directory a
                                       release runs from, first on `PYTHONPATH`

ROOT is `$HARNESS_RELEASE_STORE`, else `~/.cache/mamba-radix-harness/releases`. Every release runs
in the one environment the harness runs in, with the dependency set in
`requirements/sglang-releases.txt` (one set serves 0.5.3.post2 .. 0.5.23: each release's cache,
pools and their import chain import and run with it), so switching releases costs a process
start, not an install. `scripts/release-store.sh` installs that set and fetches every release:

  python -m harness.releases.store [--from V] [--to V]    fetch and unpack (idempotent)
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, TextIO

from harness.caches.sglang_releases import RELEASES, release_range

DEFAULT_ROOT = Path("~/.cache/mamba-radix-harness/releases")


class StoreError(Exception):
    """A release that is not in the store and cannot be put there; the message says why."""


class ReleaseStore:
    """Wheels under `root/wheels`, each unpacked once under `root/unpacked/VERSION`."""

    def __init__(self, root: Optional[os.PathLike] = None):
        chosen = root if root is not None else os.environ.get("HARNESS_RELEASE_STORE") or DEFAULT_ROOT
        self.root = Path(chosen).expanduser()

    def unpacked(self, version: str) -> Path:
        return self.root / "unpacked" / version

    def has(self, version: str) -> bool:
        return (self.unpacked(version) / "sglang" / "version.py").is_file()

    def wheel(self, version: str) -> Optional[Path]:
        """The release's wheel in the store, if fetched."""
        found = sorted(glob.glob(str(self.root / "wheels" / f"sglang-{version}-*.whl")))
        return Path(found[0]) if found else None

    def fetch(self, version: str) -> Path:
        """The release's wheel, downloaded when not in the store yet (`pip download --no-deps`,
        the wheel built for this interpreter); StoreError with pip's last line when it fails."""
        wheel = self.wheel(version)
        if wheel is not None:
            return wheel
        dest = self.root / "wheels"
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest), f"sglang=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheel = self.wheel(version)
        if done.returncode != 0 or wheel is None:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip() and "WARNING" not in line]
            raise StoreError(f"pip download sglang=={version} failed: {lines[-1] if lines else 'no wheel'}")
        return wheel

    def ensure(self, version: str) -> Path:
        """The directory the release runs from, fetched and unpacked first if need be (one
        process at a time: others wait on the store's lock, then find it there)."""
        if self.has(version):
            return self.unpacked(version)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._unpack(version)

    def _unpack(self, version: str) -> Path:
        if self.has(version):
            return self.unpacked(version)
        wheel = self.fetch(version)
        target = self.unpacked(version)
        partial = target.with_name(version + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target

    def environment(self, version: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The environment a process runs the release in: its unpacked wheel first on
        `PYTHONPATH` (ahead of any installed SGLang), then this checkout."""
        env = dict(os.environ if base is None else base)
        checkout = str(Path(__file__).resolve().parents[2])
        paths = [str(self.ensure(version)), checkout] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
        return env


def fill(store: ReleaseStore, versions: Iterable[str], out: TextIO) -> List[str]:
    """Fetch and unpack each release; the ones that failed, each reported on `out`."""
    failed = []
    for version in versions:
        try:
            where = store.ensure(version)
        except StoreError as exc:
            out.write(f"{version}: {exc}\n")
            failed.append(version)
        else:
            out.write(f"{version}: {where}\n")
    return failed


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.releases.store", description="Fetch and unpack SGLang releases into the release store.")
    parser.add_argument("--from", dest="first", default=RELEASES[0], help=f"first release (default {RELEASES[0]})")
    parser.add_argument("--to", dest="last", default=RELEASES[-1], help=f"last release (default {RELEASES[-1]})")
    parser.add_argument("--root", default=None, help="the store (default $HARNESS_RELEASE_STORE or ~/.cache/mamba-radix-harness/releases)")
    args = parser.parse_args(argv)
    try:
        versions = release_range(args.first, args.last)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not versions:
        print(f"error: no release between {args.first} and {args.last}", file=sys.stderr)
        return 2
    return 1 if fill(ReleaseStore(args.root), versions, sys.stdout) else 0


if __name__ == "__main__":
    sys.exit(main())
