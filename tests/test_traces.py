"""Capture, replay command, determinism and bad files of the trace format."""

import functools
import io
import json
import os
import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from broken_impls import SplitOffByOne
from harness import cli
from harness.caches import ImplCache
from harness.engines.hypothesis_engine import machine_for
from harness.trace import Failure, TraceError, Verdict, judge, load_trace, parse_trace, replay
from strategies import SCENARIOS

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
GOOD = os.path.join(HERE, "regressions", "chunked-prefill-across-a-split.json")


def find_bug(trace_dir):
    """Let the state machine find the planted split bug; return the trace files it wrote."""
    cache = functools.partial(ImplCache, cache_class=SplitOffByOne)
    machine = machine_for(SCENARIOS["medium"], cache, trace_dir=str(trace_dir))
    budget = settings(settings(), max_examples=200, derandomize=True, database=None, report_multiple_bugs=False)
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=budget)
    return sorted(trace_dir.iterdir()), caught.value


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    """One run of the machine against the planted split bug: (trace files, the error)."""
    return find_bug(tmp_path_factory.mktemp("found"))


def run_cli(*args):
    # the CLI's own output only: without numpy installed, importing torch warns on stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_a_found_bug_becomes_a_trace_that_replays_the_same_failure(found):
    files, error = found
    assert len(files) == 1
    notes = "\n".join(getattr(error, "__notes__", []))
    assert f"python -m harness replay {files[0]}" in notes

    broken = run_cli("replay", str(files[0]), "--impl", "broken_impls:SplitOffByOne")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "FAILED at step" in broken.stdout
    assert "cache" in broken.stdout and "model" in broken.stdout

    recorded = run_cli("replay", str(files[0]))  # by default: where it was recorded
    assert recorded.returncode == 1 and "where it was recorded" in recorded.stdout, recorded.stdout + recorded.stderr

    fixed = run_cli("replay", str(files[0]), "--impl", "impl")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "OK: all" in fixed.stdout


def test_the_same_seed_gives_the_same_trace_byte_for_byte(found, tmp_path):
    first, _ = found
    second, _ = find_bug(tmp_path)
    assert [p.name for p in first] == [p.name for p in second]
    assert first[0].read_bytes() == second[0].read_bytes()


def test_replaying_a_trace_a_hundred_times_gives_one_verdict(found):
    files, _ = found
    trace = load_trace(str(files[0]))
    broken = functools.partial(ImplCache, cache_class=SplitOffByOne)
    verdicts = {(v.ok, v.failure.step, v.failure.check) for v in (replay(trace, broken) for _ in range(100))}
    assert len(verdicts) == 1 and not next(iter(verdicts))[0]


def test_verbose_replay_prints_each_operation_and_the_tree():
    out = io.StringIO()
    assert cli.main(["replay", GOOD, "--verbose"], out=out) == 0
    text = out.getvalue()
    assert "step 0: arrive(" in text and "step 1: iterate(" in text
    assert "tombstone lock=" in text and "lru=" in text


def test_to_pytest_prints_a_function_that_runs(tmp_path):
    out = io.StringIO()
    assert cli.main(["replay", GOOD, "--to-pytest"], out=out) == 0
    source = out.getvalue()
    assert source.count("def test_replay_") == 1
    namespace = {}
    exec(compile(source, "generated", "exec"), namespace)
    next(f for name, f in namespace.items() if name.startswith("test_replay_"))()


def doc(**changes):
    with open(GOOD) as f:
        d = json.load(f)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "document, message",
    [
        ([], r"expected a JSON object, got list"),
        (doc(schema="other"), r"field 'schema': expected 'mamba-radix-cache-trace'"),
        (doc(version=99), r"field 'version': version 99 is newer than this harness reads \(3\)"),
        (doc(version=1), r"field 'version': version 1 traces hold direct cache calls from before the scheduler protocols"),
        (doc(config={"kv_size": 0, "mamba_size": 2, "req_size": 1}), r"field 'config': CacheConfig.kv_size must be a positive int, got 0"),
        (doc(scheduler={"schedule_policy": "lifo"}), r"field 'scheduler': SchedulerConfig.schedule_policy must be one of"),
        (doc(protocol="sglang-9.9"), r"field 'protocol': expected one of \['contract', 'scheduler', 'sglang-0.5.4'"),
        (doc(set_aside=["no-such-finding"]), r"field 'set_aside': expected a list of known findings"),
        (doc(operations=[{"op": "arrive", "args": {"tokens": [1, "x"], "extra_key": None, "max_new_tokens": 1}}]), r"step 0: field 'args.tokens': expected a list of non-negative ints"),
        (doc(operations=[{"op": "fly", "args": {}}]), r"step 0: field 'op': unknown operation 'fly'"),
        (doc(operations=[{"op": "evict", "args": {}}]), r"step 0: field 'args.num_tokens': evict needs argument 'num_tokens'"),
        (doc(operations=[{"op": "evict", "args": {"num_tokens": 1, "x": 2}}]), r"step 0: field 'args.x': evict takes no argument 'x'"),
        (doc(surprise=1), r"field 'surprise': unknown field"),
        (doc(known_failure=3), r"field 'known_failure': expected null or a reason"),
        (doc(set_aside=["own_storage | x | y"]), r"field 'set_aside': not a failure signature: 'own_storage \| x \| y'"),
        (doc(failure={"check": "sizes", "message": "m", "step": 0, "signature": {"kind": "odd", "check": "c", "what": "w"}}),
         r"field 'failure': signature kind must be invariant, divergence or exception, got 'odd'"),
    ],
)
def test_malformed_traces_get_one_clear_error(document, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(document, "bad.json")


def test_a_trace_that_does_not_fit_the_state_names_the_step(tmp_path):
    path = tmp_path / "unfit.json"
    path.write_text(json.dumps(doc(operations=[{"op": "abort", "args": {"rid": 3}}])))
    with pytest.raises(TraceError, match=r"unfit.json: step 0: field 'args.rid': abort\(rid=3\): no live request 3"):
        replay(load_trace(str(path)), source=str(path))


@pytest.mark.parametrize("content, message", [("{not json", r"not JSON: .* line 1"), (None, r"cannot read")])
def test_unreadable_files_exit_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    result = run_cli("replay", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {path}")


def test_cli_refuses_an_unloadable_impl():
    result = run_cli("replay", GOOD, "--impl", "nowhere:Cache")
    assert result.returncode == 2 and "--impl nowhere:Cache: cannot load it" in result.stderr


def test_judge_expects_a_pass_unless_a_known_failure_is_recorded():
    trace = load_trace(GOOD)
    passed = Verdict(3)
    failed = Verdict(2, Failure("trees_equal", "differ", 1))
    assert judge(trace, passed) is None
    assert judge(trace, failed) == "failed at step 1: differ"
    trace.known_failure = "split loses a slot (bug #12)"
    trace.failure = Failure("trees_equal", "differ", 1)
    assert judge(trace, failed) is None
    assert "now passes: clear known_failure to promote it" in judge(trace, passed)
    other = Verdict(2, Failure("sizes", "off", 1))
    assert judge(trace, other) == "fails with sizes, but the known failure recorded trees_equal"


def test_a_known_failure_belongs_to_the_cache_and_version_it_names():
    trace = load_trace(GOOD)
    trace.impl, trace.impl_version = "sglang", "0.5.4"
    trace.known_failure = "SGLang 0.5.4 leaks a slot"
    trace.failure = Failure("pool_conservation", "leaked", 1)
    failed = Verdict(2, Failure("pool_conservation", "leaked", 1))
    assert judge(trace, failed, impl="sglang", version="0.5.4") is None
    assert judge(trace, Verdict(3), impl="impl", version="0.1.0") is None
    assert judge(trace, failed, impl="sglang", version="0.5.20") == "failed at step 1: leaked"


def test_a_trace_replays_where_it_was_recorded_or_is_refused_in_one_line():
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version

    path = os.path.join(os.path.dirname(__file__), "regressions", "sglang-0.5.4", "retract-passes-is-insert.json")
    result = run_cli("replay", path)
    if not sglang_unavailable() and sglang_version() == "0.5.4":
        assert result.returncode == 1 and "against sglang 0.5.4, where it was recorded" in result.stdout
        return
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: {path} was recorded on sglang (SGLang 0.5.4), ")
