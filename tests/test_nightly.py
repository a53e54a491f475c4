"""`python -m harness.nightly`: the nightly job's logic, run here on the CPU as on a GPU runner."""

import json
import os
import subprocess
import sys

import pytest

from harness.caches.sglang_releases import RELEASES
from harness.nightly import compare

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)


def nightly(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]))
    return subprocess.run([sys.executable, "-m", "harness.nightly", *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def test_the_plan_fuzzes_impl_the_newest_release_on_both_cores_and_a_ref_on_both_cores(tmp_path):
    result = nightly("--plan", "--state", str(tmp_path / "state"), "--out", str(tmp_path / "out"), "--sglang-ref", "my-branch",
                     "--device", "cuda")
    assert result.returncode == 0, result.stderr
    names = [line.split(":")[0] for line in result.stdout.splitlines()]
    newest = RELEASES[-1]
    assert names == ["impl", f"sglang-{newest}-python", f"sglang-{newest}-rust", "sglang-my-branch-python", "sglang-my-branch-rust"]
    ref_line = result.stdout.splitlines()[3]
    assert "git -C" in ref_line and "fetch --quiet origin my-branch" in ref_line and "pip install --quiet --no-deps --no-build-isolation -e" in ref_line
    assert "--impl sglang-rust" in result.stdout.splitlines()[4]


@pytest.mark.parametrize("args, message", [
    (["--minutes", "0"], "--minutes must be positive, got 0.0"),
    (["--sglang-ref", "main", "--sglang-checkout", "."], "give --sglang-ref or --sglang-checkout, not both"),
    (["--sglang-checkout", "/nonexistent"], "--sglang-checkout /nonexistent: not an SGLang checkout (no python/ directory)"),
    (["--target", "noequals"], "--target must be NAME=IMPL"),
    (["--release", "9.9"], "--release 9.9: not a release the harness knows"),
    (["--target", "impl=impl"], "two targets share a name"),
])
def test_unusable_options_are_one_line_and_exit_2(args, message, tmp_path):
    result = nightly("--state", str(tmp_path / "s"), "--out", str(tmp_path / "o"), *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def bucket(key, **extra):
    return dict({"key": key, "count": 1, "trace": None, "known": None}, **extra)


def test_tonight_against_last_night_is_new_still_open_and_gone():
    last = {"results": [{"target": "a", "status": "ran", "buckets": [bucket("x"), bucket("y")]},
                        {"target": "b", "status": "ran", "buckets": [bucket("z")]}]}
    tonight = [{"target": "a", "status": "ran", "buckets": [bucket("y"), bucket("w")]},
               {"target": "b", "status": "cannot run", "why": "no SGLang"}]
    changes = compare(tonight, last)
    assert [(b["target"], b["key"]) for b in changes["new"]] == [("a", "w")]
    assert [(b["target"], b["key"]) for b in changes["still_open"]] == [("a", "y")]
    assert [(b["target"], b["key"]) for b in changes["gone"]] == [("a", "x")]  # b did not run: z is not gone


def test_two_nights_of_a_planted_bug_keep_the_database_and_report_what_is_still_open(tmp_path):
    state, out1, out2 = tmp_path / "state", tmp_path / "night1", tmp_path / "night2"
    common = ["--minutes", "0.1", "--state", str(state), "--no-release", "--no-impl", "--workers", "1",
              "--target", "planted=broken_impls:SplitOffByOne"]
    first = nightly(*common, "--out", str(out1))
    assert first.returncode == 1, first.stdout + first.stderr  # everything is new the first night
    report = json.loads((out1 / "nightly-report.json").read_text())
    assert report["changes"]["new"] and not report["changes"]["still_open"]
    assert (out1 / "planted" / "report.json").exists() and list((out1 / "planted" / "traces").glob("*.json"))
    assert (state / "db" / "planted").is_dir() and (state / "last-report.json").exists()
    assert "## New (no report from a last night)" in (out1 / "summary.md").read_text()
    second = nightly(*common, "--out", str(out2))
    report = json.loads((out2 / "nightly-report.json").read_text())
    assert report["last_night"] == str(state / "last-report.json")
    assert report["changes"]["still_open"], second.stdout
    assert second.returncode == (1 if report["changes"]["new"] else 0)
    assert "## Still open" in second.stdout and "## Gone since the last night" in second.stdout


def test_a_target_that_cannot_run_is_reported_and_fails_the_night(tmp_path):
    result = nightly("--minutes", "0.05", "--state", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--no-release", "--no-impl",
                     "--target", "missing=no_such_module:Cache")
    assert result.returncode == 1
    assert "- missing: cannot run: error: --impl no_such_module:Cache: cannot load it" in result.stdout
