"""The fuzz command: progress, report, exit status, traces from both engines, shared Redis database."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import functools

import pytest

from broken_impls import SplitOffByOne
from harness.caches import ImplCache
from harness.trace import load_trace
from harness.trace import replay as replay_trace

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)


def fuzz(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]))
    return subprocess.run(
        [sys.executable, "-m", "harness", "fuzz", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def replay(path, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]))
    return subprocess.run([sys.executable, "-m", "harness", "replay", path, *args], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("engine", ["hypothesis", "random"])
def test_a_short_fuzz_of_the_correct_impl_reports_and_exits_0(engine, tmp_path):
    report = tmp_path / "report.json"
    result = fuzz("--seconds", "6", "--engine", engine, "--workers", "2", "--report", str(report),
                  "--db", str(tmp_path / "db"), "--trace-dir", str(tmp_path / "traces"), "--profile", "ci")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fuzz: " in result.stdout and "steps (" in result.stdout
    data = json.loads(report.read_text())
    assert data["steps_per_second"] > 0 and data["programs"] > 0 and data["failures"] == []
    assert data["workers"] == 2 and data["versions"]["hypothesis"] and data["device"] == "cpu"
    assert data["reach"]


@pytest.mark.parametrize("engine", ["hypothesis", "random"])
def test_a_planted_bug_exits_1_with_a_trace_that_replays_to_the_same_failure(engine, tmp_path):
    report = tmp_path / "report.json"
    result = fuzz("--seconds", "120", "--engine", engine, "--workers", "1", "--fail-fast", "--seed", "5",
                  "--impl", "broken_impls:SplitOffByOne", "--config", "medium", "--report", str(report),
                  "--db", str(tmp_path / "db"), "--trace-dir", str(tmp_path / "traces"), "--profile", "ci")
    assert result.returncode == 1, result.stdout + result.stderr
    failure = json.loads(report.read_text())["failures"][0]
    assert "replay with: python -m harness replay" in result.stdout
    again = replay(failure["trace"], "--impl", "broken_impls:SplitOffByOne")
    assert again.returncode == 1 and "FAILED at step" in again.stdout
    trace = load_trace(failure["trace"])
    verdict = replay_trace(trace, functools.partial(ImplCache, cache_class=SplitOffByOne))
    assert verdict.failure.check == trace.failure.check
    assert replay(failure["trace"]).returncode == 0


def test_bad_options_are_refused_with_exit_2(tmp_path):
    result = fuzz("--seconds", "1", "--config", "enormous")
    assert result.returncode == 2 and "unknown configuration(s) ['enormous']" in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        redis = None
    if server is None or redis is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide redis-server (Debian package) and the redis package; .ci/run installs both")
        pytest.skip("redis-server or the redis package is not installed")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def test_a_failure_found_by_one_process_is_replayed_first_by_another(redis_url, tmp_path):
    common = ["--engine", "hypothesis", "--workers", "1", "--fail-fast", "--impl", "broken_impls:SplitOffByOne",
              "--config", "medium", "--db", redis_url, "--trace-dir", str(tmp_path / "traces"), "--profile", "ci"]
    first = fuzz("--seconds", "120", "--seed", "11", "--report", str(tmp_path / "a.json"), *common)
    assert first.returncode == 1, first.stdout + first.stderr
    second = fuzz("--seconds", "120", "--seed", "12", "--report", str(tmp_path / "b.json"), *common)
    assert second.returncode == 1, second.stdout + second.stderr
    assert json.loads((tmp_path / "b.json").read_text())["first_failure_programs"] == 1
