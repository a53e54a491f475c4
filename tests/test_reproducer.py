"""`replay TRACE --to-script`: a standalone reproducer that fails on an affected release and
passes on a fixed one, run where this project is not installed.

The scripts are written from the 0.5.4 regression traces with SGLang 0.5.4 installed (tests marked
`sglang`) and run by `$HARNESS_REPRO_PYTHON`, an interpreter that has SGLang's dependencies but not
this project (`python -m venv V && V/bin/pip install torch==2.13.0 -r requirements/sglang-releases.txt`),
each release taken from the release store (`scripts/release-store.sh --from 0.5.4 --to 0.5.5`).
"""

import os
import subprocess
import sys

import pytest

from harness.caches.sglang_loader import sglang_unavailable, sglang_version
from harness.releases.store import ReleaseStore

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
REGRESSIONS = os.path.join(HERE, "regressions")
REPRO_PYTHON = os.environ.get("HARNESS_REPRO_PYTHON")

# (trace, what the script ends on, a release it affects, the release that fixed it)
FINDINGS = [
    ("retract-passes-is-insert", "TypeError: MambaRadixCache.cache_finished_req() got an unexpected keyword argument 'is_insert'", "0.5.4", "0.5.4.post3"),
    ("idle-sanity-check-lru-order", "Incorrect LRU list", "0.5.4", "0.5.4.post3"),
    ("finished-mamba-slot-int32", "its mamba_value is torch.int32 on cpu, not torch.int64", "0.5.4", "0.5.5"),
]


def harness(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, SGLANG_MAMBA_SSM_DTYPE="float32"))


def test_a_trace_recorded_on_impl_has_no_sglang_reproducer():
    result = harness("replay", os.path.join(REGRESSIONS, "cascade-tombstone-deletion.json"), "--to-script")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        f"error: --to-script: {os.path.join(REGRESSIONS, 'cascade-tombstone-deletion.json')} was recorded on impl, "
        "not on SGLang: --to-script writes SGLang reproducers"
    )


def test_to_script_and_to_pytest_are_one_or_the_other():
    result = harness("replay", os.path.join(REGRESSIONS, "cascade-tombstone-deletion.json"), "--to-script", "--to-pytest")
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def release_dir(version: str) -> str:
    store = ReleaseStore()
    if not store.has(version):
        pytest.skip(f"SGLang {version} is not in the release store ({store.root}): scripts/release-store.sh --from {version} --to {version}")
    return str(store.unpacked(version))


@pytest.fixture
def clean_python():
    if not REPRO_PYTHON:
        pytest.skip("set HARNESS_REPRO_PYTHON to an interpreter with SGLang's dependencies and without this project")
    probe = subprocess.run([REPRO_PYTHON, "-c", "import harness"], cwd="/", capture_output=True, text=True)
    assert probe.returncode != 0, f"{REPRO_PYTHON} can import this project: not a clean environment for a reproducer"
    return REPRO_PYTHON


@pytest.mark.sglang
@pytest.mark.parametrize("name, ending, affected, fixed", FINDINGS, ids=[f[0] for f in FINDINGS])
def test_the_reproducer_fails_on_an_affected_release_and_passes_on_the_fixed_one(name, ending, affected, fixed, clean_python, tmp_path):
    if sglang_unavailable() or sglang_version() != "0.5.4":
        pytest.skip("writes the scripts from SGLang 0.5.4's traces: needs 0.5.4 installed")
    result = harness("replay", os.path.join(REGRESSIONS, "sglang-0.5.4", f"{name}.json"), "--to-script")
    assert result.returncode == 0, result.stderr
    script = tmp_path / f"{name}.py"
    script.write_text(result.stdout)
    imports = {line.split()[1].split(".")[0] for line in result.stdout.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"sglang", "torch", "gc", "importlib", "os", "re", "sys", "time", "types", "weakref", "typing", "array"}, imports
    for release, passes in ((affected, False), (fixed, True)):
        run = subprocess.run([clean_python, str(script)], cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=release_dir(release)))
        if passes:
            assert run.returncode == 0 and run.stdout.strip().splitlines()[-1].startswith("OK: the"), run.stderr[-2000:]
        else:
            assert run.returncode == 1 and ending in run.stderr.strip().splitlines()[-1], run.stderr[-2000:]


@pytest.mark.sglang
def test_a_trace_of_the_release_s_own_scheduler_is_scripted_from_its_hand_written_calls(tmp_path):
    """The real scheduler's in-process build cannot be written as a script: `--to-script`
    refuses in one line naming the hand-written protocol, and with it writes a reproducer that
    fails on the release with the finding's own assertion."""
    reason = sglang_unavailable()
    if reason:
        pytest.skip(reason)
    if sglang_version() != "0.5.23":
        pytest.skip(f"the trace was recorded on SGLang 0.5.23 (installed: {sglang_version()})")
    trace = os.path.join(REGRESSIONS, "sglang-0.5.23", "scheduler-reset-drops-linked-tree.json")
    refused = harness("replay", trace, "--to-script")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "whose in-process build a script cannot write: --protocol unified" in refused.stderr.strip().splitlines()[-1]
    written = harness("replay", trace, "--to-script", "--protocol", "unified")
    assert written.returncode == 0, written.stderr
    script = tmp_path / "repro.py"
    script.write_text(written.stdout)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(tmp_path),
                         env=dict(os.environ, SGLANG_MAMBA_SSM_DTYPE="float32"))
    assert run.returncode != 0 and "that left the tree are still alive" in run.stderr
