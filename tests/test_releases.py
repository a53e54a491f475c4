"""Every SGLang release under test: the release catalogue, the store, the history of a trace's
verdicts, the `releases` command's refusals, and the command itself on the three hard-scenario
traces over a few releases (skipping, saying why, where the releases cannot be fetched or run)."""

import io
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest

from harness.caches.sglang_releases import (
    MAMBA_ERAS,
    RELEASES,
    caches_of,
    mamba_era,
    mamba_radix_cache_rules,
    release_range,
    served_cache,
    unified_rules,
)
from harness.cli import main
from harness.releases.history import describe, history, print_table, summarize
from harness.releases.store import ReleaseStore, StoreError
from reference import SGLANG_0_5_4, SGLANG_0_5_20, SGLANG_UNIFIED, SGLANG_UNIFIED_0_5_20

HERE = os.path.dirname(__file__)
HARD_SCENARIOS = ["cascade-tombstone-deletion.json", "cow-with-full-mamba-pool.json", "chunked-prefill-across-a-split.json"]
# the oldest, one from the middle (0.5.13: the Mamba slot allocator's first release), the newest
FEW_RELEASES = ["0.5.4", "0.5.13", "0.5.23"]


# ----- the catalogue ----------------------------------------------------------------------------


def test_the_catalogue_lists_every_release_from_the_first_mamba_radix_cache_to_the_newest_in_order():
    assert RELEASES[0] == "0.5.3.post2" and RELEASES[-1] == "0.5.23"
    assert len(RELEASES) == 36 and len(set(RELEASES)) == 36
    assert list(release_range(RELEASES[0], RELEASES[-1])) == list(RELEASES)
    assert release_range("0.5.10rc0", "0.5.10.post1") == ("0.5.10rc0", "0.5.10", "0.5.10.post1")


def test_every_release_with_mamba_radix_cache_falls_in_exactly_one_api_era():
    for version in RELEASES[: RELEASES.index("0.5.20") + 1]:
        assert sum(release_range(*bounds).count(version) for bounds in MAMBA_ERAS.values()) == 1, version
    assert mamba_era("0.5.5.post3") == "kwargs" and mamba_era("0.5.6") == "init-params" and mamba_era("0.5.20") == "req-kv"
    with pytest.raises(ValueError, match="0.5.21 ships no MambaRadixCache"):
        mamba_era("0.5.21")


def test_each_release_serves_the_cache_its_scheduler_builds_and_lists_the_others():
    assert caches_of("0.5.4") == ("sglang",)
    assert caches_of("0.5.16") == ("sglang-python", "sglang")  # unified served, MambaRadixCache still shipped
    assert caches_of("0.5.20") == ("sglang-python", "sglang", "sglang-rust")
    assert caches_of("0.5.23") == ("sglang-rust", "sglang-python")  # the Rust core is the default
    assert [served_cache(v) for v in ("0.5.15.post1", "0.5.16", "0.5.21")] == ["sglang", "sglang-python", "sglang-rust"]


def test_the_per_release_rules_meet_the_rules_written_for_the_releases_the_harness_knew():
    assert mamba_radix_cache_rules("0.5.4") == replace(SGLANG_0_5_4, name="0.5.4")
    assert mamba_radix_cache_rules("0.5.20") == replace(SGLANG_0_5_20, name="0.5.20")
    assert unified_rules("0.5.20") == replace(SGLANG_UNIFIED_0_5_20, name="unified-0.5.20")
    assert unified_rules("0.5.23") == replace(SGLANG_UNIFIED, name="unified-0.5.23")


def test_a_bad_version_is_refused_naming_it():
    with pytest.raises(ValueError, match="'not-a-version'"):
        release_range("not-a-version", "0.5.23")


# ----- the history ------------------------------------------------------------------------------


def _result(release, status, cache="sglang", **extra):
    return dict(release=release, cache=cache, status=status, **extra)


def test_history_names_the_first_failing_and_first_fixed_release_and_a_regression():
    line = [
        _result("0.5.3.post2", "passed"),
        _result("0.5.4", "failed", check="own_storage", step=2),
        _result("0.5.4.post1", "cannot run", reason="x"),
        _result("0.5.5", "failed", check="own_storage", step=2),
        _result("0.5.6", "passed"),
        _result("0.5.7", "failed", check="own_storage", step=3),
    ]
    got = history(line)
    assert got["first_failing"] == "0.5.4" and got["first_fixed"] == "0.5.6"
    assert got["regressions"] == ["0.5.7"]
    assert got["changes"] == [["0.5.4", "fails"], ["0.5.6", "fixed"], ["0.5.7", "regressed"]]
    assert got["cannot_run"] == ["0.5.4.post1"]
    assert describe("served", got) == "served: first failing 0.5.4; fixed in 0.5.6; REGRESSION: fails again in 0.5.7"


def test_a_series_that_never_ran_or_never_failed_says_so():
    assert describe("x", history([_result("0.5.4", "cannot run", reason="r")])) == "x: ran on no release (each row says why)"
    assert describe("x", history([_result("0.5.4", "passed")])) == "x: never fails"


def test_the_served_series_follows_the_cache_each_release_builds():
    results = [
        _result("0.5.15.post1", "failed", check="c", step=1),
        _result("0.5.16", "passed", cache="sglang-python"),
        _result("0.5.16", "failed", check="c", step=1),
    ]
    summaries = summarize(results)
    assert summaries["served"]["first_fixed"] == "0.5.16"
    assert summaries["MambaRadixCache"]["first_fixed"] is None


# ----- the store --------------------------------------------------------------------------------


def _fake_wheel(store_root, version):
    wheels = store_root / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / f"sglang-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglang/__init__.py", f"__version__ = {version!r}\n")
        wheel.writestr("sglang/version.py", f"__version__ = {version!r}\n")


def test_the_store_unpacks_a_fetched_wheel_once_and_puts_it_first_on_the_path(tmp_path):
    _fake_wheel(tmp_path, "0.5.4")
    store = ReleaseStore(tmp_path)
    where = store.ensure("0.5.4")
    assert where == tmp_path / "unpacked" / "0.5.4" and store.has("0.5.4")
    (where / "marker").write_text("kept")
    assert store.ensure("0.5.4") == where and (where / "marker").exists()  # not unpacked again
    env = store.environment("0.5.4", base={"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(where)
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/elsewhere"
    done = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "0.5.4"


def test_a_release_that_cannot_be_fetched_is_a_store_error_naming_it(tmp_path, monkeypatch):
    def refuse(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found for sglang==0.5.4\n")

    monkeypatch.setattr(subprocess, "run", refuse)
    with pytest.raises(StoreError, match=r"sglang==0\.5\.4 failed: ERROR: No matching distribution"):
        ReleaseStore(tmp_path).ensure("0.5.4")


# ----- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (["releases"], "give a TRACE to replay, or --fuzz SECONDS"),
        (["releases", "x.json", "--fuzz", "5"], "not both"),
        (["releases", os.path.join(HERE, "regressions", HARD_SCENARIOS[0]), "--from", "nonsense"], "'nonsense'"),
        (["releases", os.path.join(HERE, "regressions", HARD_SCENARIOS[0]), "--from", "0.6.0"], "no release from 0.6.0"),
        (["releases", "no-such-trace.json"], "no-such-trace.json"),
    ],
)
def test_unusable_arguments_exit_2_with_one_line_naming_them(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def _runnable_or_skip(version):
    """Skip, saying why, when `version` cannot be fetched into the store or run here."""
    from harness.releases.runner import run_release

    try:
        ReleaseStore().ensure(version)
    except StoreError as exc:
        pytest.skip(f"SGLang {version} cannot be fetched: {exc}")
    probe = os.path.join(HERE, "regressions", HARD_SCENARIOS[0])
    results = run_release(ReleaseStore(), version, ["replay", probe], timeout=600)
    cannot = [r["reason"] for r in results if r["status"] == "cannot run"]
    if cannot:
        pytest.skip(f"SGLang {version} cannot run here ({cannot[0]}); scripts/release-store.sh installs what it needs")


def _releases(argv):
    """`python -m harness releases ...`: its exit status and what it printed."""
    out = io.StringIO()
    return main(["releases", *argv], out=out), out.getvalue()


@pytest.mark.parametrize("trace", HARD_SCENARIOS)
def test_the_hard_scenarios_pass_on_every_cache_of_a_few_releases(trace):
    for version in FEW_RELEASES:
        _runnable_or_skip(version)
    path = os.path.join(HERE, "regressions", trace)
    status, printed = _releases([path, "--from", FEW_RELEASES[0], "--to", FEW_RELEASES[0], "--json"])
    assert status == 0 and [r["status"] for r in json.loads(printed)["results"]] == ["passed"]
    for version in FEW_RELEASES[1:]:
        status, out = _releases([path, "--from", version, "--to", version])
        rows = [line for line in out.splitlines() if line.startswith(version + " ")]
        assert status == 0 and rows and all(line.endswith("passed") for line in rows), out
        assert "served: never fails" in out


def test_a_finding_trace_fails_where_its_finding_is_and_passes_where_it_is_fixed():
    """0.5.4's scheduler passes `is_insert` to a `cache_finished_req` that does not take it
    (`retract-passes-is-insert`); 0.5.4.post3's cache takes it."""
    for version in ("0.5.4", "0.5.4.post3"):
        _runnable_or_skip(version)
    path = os.path.join(HERE, "regressions", "sglang-0.5.4", "retract-passes-is-insert.json")
    status, printed = _releases([path, "--from", "0.5.4", "--to", "0.5.4.post3", "--json"])
    report = json.loads(printed)
    assert status == 1
    verdicts = {r["release"]: r["status"] for r in report["results"]}
    assert verdicts["0.5.4"] == "failed" and verdicts["0.5.4.post3"] == "passed"
    assert report["summary"]["served"]["first_fixed"] == "0.5.4.post3"
    assert report["summary"]["served"]["failing_in"] == ["0.5.4", "0.5.4.post1", "0.5.4.post2"]


def test_a_fuzz_of_a_release_reports_every_cache_with_its_findings_set_aside(tmp_path):
    _runnable_or_skip("0.5.13")
    status, out = _releases(["--fuzz", "5", "--seed", "3", "--from", "0.5.13", "--to", "0.5.13", "--trace-dir", str(tmp_path)])
    rows = [line for line in out.splitlines() if line.startswith("0.5.13 ")]
    assert status == 0 and len(rows) == 1 and rows[0].endswith("passed"), out


def test_the_table_lists_each_fuzz_failure_with_its_trace():
    out = io.StringIO()
    failure = {"check": "own_storage", "message": "a view of a pool's free list", "trace": "/tmp/own_storage-2ops.json"}
    print_table([_result("0.5.9", "failed", protocol="contract", failures=[failure])], out)
    text = out.getvalue()
    assert "failed (1 program(s): own_storage)" in text and "/tmp/own_storage-2ops.json" in text
