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
    assert verdict.failure.signature.key == trace.failure.signature.key == failure["key"]
    by_default = replay(failure["trace"])  # where it was recorded: the planted bug
    assert by_default.returncode == 1 and "broken_impls:SplitOffByOne" in by_default.stdout.splitlines()[0]
    assert replay(failure["trace"], "--impl", "impl").returncode == 0


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


@pytest.mark.parametrize("workers", [1, 2])
def test_without_fail_fast_each_distinct_failure_is_one_bucket_and_the_fuzz_runs_its_whole_budget(workers, tmp_path):
    """Every configuration keeps being fuzzed: a failure's signature is set aside once its first
    program is shrunk, and later programs that meet it only count in its bucket; with two
    workers, one of them claims each signature."""
    report = tmp_path / "report.json"
    result = fuzz("--seconds", "20", "--engine", "random", "--workers", str(workers), "--seed", "3",
                  "--impl", "broken_impls:SplitOffByOne", "--config", "tiny", "--config", "medium",
                  "--report", str(report), "--trace-dir", str(tmp_path / "traces"), "--profile", "ci")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(report.read_text())
    assert data["elapsed_seconds"] >= 19
    keys = [b["key"] for b in data["buckets"]]
    assert len(keys) >= 2 and len(set(keys)) == len(keys)
    assert data["failures"] == data["buckets"]  # an impl's failures are all new
    assert sum(b["count"] for b in data["buckets"]) > len(keys)  # later programs met them, set aside
    for bucket in data["buckets"]:
        assert bucket["known"] is None and bucket["config"] in ("tiny", "medium")
        trace = load_trace(bucket["trace"])
        assert trace.failure.signature.key == bucket["key"]
        verdict = replay_trace(trace, functools.partial(ImplCache, cache_class=SplitOffByOne))
        assert verdict.failure.signature.key == bucket["key"]
    for key in keys:
        assert key in result.stdout


def test_a_trace_or_a_signature_given_to_set_aside_keeps_that_failure_out_of_the_next_run(tmp_path):
    first = tmp_path / "first.json"
    common = ("--engine", "random", "--workers", "1", "--impl", "broken_impls:SplitOffByOne", "--config", "tiny",
              "--profile", "ci", "--trace-dir", str(tmp_path / "traces"))
    fuzz("--seconds", "6", "--seed", "3", "--report", str(first), *common)
    buckets = json.loads(first.read_text())["buckets"]
    assert len(buckets) >= 2
    aside = ["--set-aside", buckets[0]["trace"], "--set-aside", buckets[1]["key"]]
    second = tmp_path / "second.json"
    result = fuzz("--seconds", "6", "--seed", "3", "--report", str(second), *aside, *common)
    data = json.loads(second.read_text())
    assert {buckets[0]["key"], buckets[1]["key"]} <= set(data["set_aside"]), result.stdout + result.stderr
    assert not {b["key"] for b in data["buckets"]} & {buckets[0]["key"], buckets[1]["key"]}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set-aside", "no-such-finding"], "--set-aside: unknown finding 'no-such-finding'"),
        (["--set-aside", "retract-passes-is-insert"], "--set-aside retract-passes-is-insert: affects 0.5.3.post2 .. 0.5.4.post2, not the release under test"),
        (["--protocol", "sglang-9.9"], "--protocol must be one of"),
        (["--set-aside", "own_storage | Mamba slot | x"], "not a failure signature: 'own_storage | Mamba slot | x'"),
        (["--set-aside", "no-such-trace.json"], "--set-aside: no-such-trace.json: cannot read"),
    ],
)
def test_unusable_set_aside_and_protocol_are_refused_with_exit_2(args, message):
    result = fuzz("--seconds", "1", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_long_run_of_bounded_pools_does_not_grow_memory():
    """Programs build their pools and caches, run and drop them: after a warm-up, many more
    programs leave no more Python memory allocated than a few programs did (a node, a request
    or a tensor kept alive by the harness or the cache would add up)."""
    import gc
    import random
    import tracemalloc

    from harness.engines.random_engine import random_program
    from strategies import SCENARIOS

    rng = random.Random(7)

    def run(programs: int) -> None:
        for _ in range(programs):
            random_program(SCENARIOS["medium"], ImplCache, rng, 50, "cpu", "/nonexistent")
        gc.collect()

    run(20)  # warm-up: caches of strategies, lazily built tables, Python's own free lists
    tracemalloc.start()
    try:
        run(10)
        settled = tracemalloc.get_traced_memory()[0]
        run(200)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - settled < 256 * 1024, f"{after - settled} bytes more after 200 more programs"


def test_garbage_the_collector_was_paused_over_is_collected_within_the_interval(monkeypatch):
    """Whatever was alive when a program paused the collector goes back into the oldest
    generation when it resumes; with the collector off during every program, only `resume_gc`'s
    periodic full collection frees such garbage (a Hypothesis fuzz grew by megabytes a second
    without it)."""
    import weakref

    from harness import driver

    class Cycle:
        pass

    cycle = Cycle()
    cycle.itself = cycle
    alive = weakref.ref(cycle)
    was_enabled = driver.pause_gc()  # `cycle` is frozen while still referred to
    del cycle
    monkeypatch.setattr(driver, "_last_full_collection", float("-inf"))  # the interval has passed
    driver.resume_gc(was_enabled)
    assert alive() is None


def test_fuzz_options_given_in_code_are_checked_too():
    from harness.fuzz import FuzzOptions

    with pytest.raises(ValueError, match=r"--config: unknown configuration\(s\) \['enormous'\]"):
        FuzzOptions(configs=["enormous"], device="cpu").check()
    with pytest.raises(ValueError, match="the budget must be a positive, finite number of seconds, got nan"):
        FuzzOptions(seconds=float("nan"), device="cpu").check()


def test_shrinking_stops_at_its_deadline_with_a_trace_that_still_fails(tmp_path):
    """A failure found as the budget runs out is shrunk only as far as time allows: past the
    deadline no reduction is tried, and what is kept still fails the same way."""
    import random

    from harness.engines.random_engine import ProgramFailed, random_program
    from harness.engines.shrink import shrink_operations
    from strategies import SCENARIOS

    factory = functools.partial(ImplCache, cache_class=SplitOffByOne)
    failed = None
    for seed in range(50):
        try:
            random_program(SCENARIOS["medium"], factory, random.Random(seed), 200, "cpu", str(tmp_path), shrink=False)
        except ProgramFailed as exc:
            failed = exc.trace
            break
    assert failed is not None, "the planted bug was not met in 50 programs"
    kept = shrink_operations(failed, factory, until=time.monotonic() - 1)
    assert kept.operations == failed.operations and kept.failure.check == failed.failure.check
    shrunk = shrink_operations(failed, factory)
    assert len(shrunk.operations) < len(failed.operations) and shrunk.failure.check == failed.failure.check


def test_the_extra_buffer_is_drawn_only_where_the_cache_and_every_protocol_take_it():
    """impl (the contract, no extra buffer) draws no_buffer alone; a pinned strategy is every
    program's."""
    from harness.fuzz.options import FuzzOptions

    from strategies.config import NO_BUFFER, serving

    assert set(FuzzOptions(impl="impl").scenario("medium").servings) == {NO_BUFFER}
    pinned = FuzzOptions(impl="impl", mamba_strategy="extra_buffer").scenario("chunked")
    drawn = {serving("extra_buffer", loop, page) for loop in ("overlap", "normal") for page in (1, 4)} | {serving("extra_buffer", "overlap", 16)}
    assert set(pinned.servings) == drawn  # page sizes 16 under the normal loop and 64: only pinned
    assert pinned.name == "chunked"
    both = FuzzOptions(impl="impl", mamba_strategy="extra_buffer", event_loop="normal").scenario("chunked")
    assert set(both.servings) == {serving("extra_buffer", "normal"), serving("extra_buffer", "normal", 4)}
    paged = FuzzOptions(impl="impl", mamba_strategy="extra_buffer", page_size=64).scenario("chunked")
    assert set(paged.servings) == {serving("extra_buffer", "overlap", 64), serving("extra_buffer", "normal", 64)}
