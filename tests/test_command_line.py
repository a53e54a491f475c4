"""Every command as a new user meets it: a bad input is one line on stderr naming the option and
the value, exit status 2, before any work starts; Ctrl-C and SIGTERM stop a fuzz with its
summary and report; `--help` lists choices and defaults."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
TRACE = os.path.join(HERE, "regressions", "cascade-tombstone-deletion.json")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]))


def run(*argv, cwd=ROOT, env=ENV, timeout=120):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def assert_refused(result, message):
    """Exit 2, one line on stderr holding `message`, no traceback, nothing run."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "programs" not in result.stdout


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["replay", TRACE, "--device", "cuda"], "--device cuda: CUDA is not available", marks=NO_CUDA),
        (["replay", TRACE, "--device", "bogus"], "--device: not a torch device: 'bogus'"),
        (["replay", TRACE, "--device", "meta"], "--device meta: a meta tensor holds no data"),
        (["replay", TRACE, "--impl", "collections:OrderedDict"], "is not a subclass of impl's MambaRadixCache"),
        (["replay", TRACE, "--impl", "impl:RadixKey"], "--impl impl:RadixKey: <class 'impl.radix_key.RadixKey'> is not a subclass"),
        (["fuzz", "--impl", "collections:OrderedDict"], "--impl collections:OrderedDict: <class 'collections.OrderedDict'> is not a subclass"),
        (["fuzz", "--db", "redis://127.0.0.1:1/0"], "--db redis://127.0.0.1:1/0: cannot reach the Redis server"),
        (["fuzz", "--db", "mysql://x/y"], "--db mysql://x/y: unknown database"),
        (["fuzz", "--report", "/proc/nope/r.json"], "--report /proc/nope/r.json: the directory /proc/nope does not exist"),
        (["fuzz", "--report", HERE], f"--report {HERE}: is a directory, not a file"),
        (["fuzz", "--trace-dir", "/proc/nope"], "--trace-dir /proc/nope: cannot create it"),
        (["fuzz", "--seconds", "nan"], "argument --seconds: must be a positive, finite number, got 'nan'"),
        (["fuzz", "--seconds", "inf"], "argument --seconds: must be a positive, finite number, got 'inf'"),
        (["fuzz", "--minutes", "-1"], "argument --minutes: must be a positive, finite number, got '-1'"),
        (["fuzz", "--profile", "weekly"], "argument --profile: invalid choice: 'weekly'"),
        (["fuzz", "--engine", "quantum"], "argument --engine: invalid choice: 'quantum'"),
        (["fuzz", "--config", "enormous"], "argument --config: invalid choice: 'enormous'"),
        (["fuzz", "--workers", "0"], "--workers must be at least 1, got 0"),
        (["fuzz", "--tree-core", "rust"], "--tree-core applies to --impl sglang only, not to 'impl'"),
        (["fuzz", "--impl", "sglang", "--tree-core", "c++"], "argument --tree-core: invalid choice: 'c++'"),
        (["replay", TRACE, "--impl", "impl", "--tree-core", "parity"], "--tree-core applies to --impl sglang only, not to 'impl'"),
        # impl runs inside the installed SGLang's own scheduler (none here)
        (["fuzz", "--protocol", "scheduler"], "--protocol scheduler runs impl inside SGLang's own scheduler: SGLang cannot be imported"),
        (["replay", TRACE, "--impl", "impl", "--protocol", "scheduler"], "--protocol scheduler runs impl inside SGLang's own scheduler"),
        # the extra buffer runs under a release's own scheduler only
        (["fuzz", "--mamba-strategy", "extra_buffer"], "the contract scheduler runs Mamba strategies ['no_buffer'] only, not 'extra_buffer'"),
        (["fuzz", "--mamba-strategy", "lazy"], "argument --mamba-strategy: invalid choice: 'lazy'"),
        (["replay", TRACE, "--mamba-strategy", "extra_buffer"], "runs Mamba strategies ['no_buffer'] only, not 'extra_buffer'"),
        # the overlap loop: with the extra buffer only (SGLang's no_buffer forces the normal loop)
        (["fuzz", "--event-loop", "overlap"], "the contract scheduler runs Mamba strategies ['no_buffer'] only, not 'extra_buffer'"),
        (["fuzz", "--mamba-strategy", "no_buffer", "--event-loop", "overlap"],
         "--mamba-strategy no_buffer --event-loop overlap: SGLang serves no mamba_strategy 'no_buffer', event_loop 'overlap' together"),
        (["replay", TRACE, "--event-loop", "overlap"], "SGLang serves no mamba_strategy 'no_buffer', event_loop 'overlap', page_size 1 together"),
        (["fuzz", "--event-loop", "fast"], "argument --event-loop: invalid choice: 'fast'"),
        # pages of more than one slot: with the extra buffer only, under a release's own scheduler
        (["fuzz", "--page-size", "4"], "the contract scheduler runs Mamba strategies ['no_buffer'] only, not 'extra_buffer'"),
        (["fuzz", "--mamba-strategy", "no_buffer", "--page-size", "16"],
         "--mamba-strategy no_buffer --page-size 16: SGLang serves no mamba_strategy 'no_buffer', page_size 16 together"),
        (["fuzz", "--page-size", "3"], "argument --page-size: invalid choice: 3"),
        (["replay", TRACE, "--page-size", "4"], "with --page-size 4: CacheConfig: SGLang serves no mamba_strategy 'no_buffer', event_loop 'normal', page_size 4 together"),
    ],
)
def test_a_bad_input_to_the_harness_is_one_line_and_exit_2(argv, message):
    if argv[0] == "fuzz" and not {"--seconds", "--minutes"} & set(argv):
        argv = [*argv, "--seconds", "1"]  # were the input taken, the run would be short
    assert_refused(run("-m", "harness", *argv), message)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-m", "bench.mutants", "--json", "/proc/nope/m.json"], "--json /proc/nope/m.json: the directory /proc/nope does not exist"),
        (["-m", "bench.engines", "--json", HERE], f"--json {HERE}: is a directory"),
        (["-m", "bench.throughput", "--json", "/proc/nope/t.json"], "--json /proc/nope/t.json"),
        (["-m", "bench.workload", "--json", "/proc/nope/w.json"], "--json /proc/nope/w.json"),
        (["-m", "bench.first_find", "--impl", "impl", "--trace-dir", "/proc/nope"], "--trace-dir /proc/nope: cannot create it"),
        (["-m", "bench.mutants", "--only", "no-such-bug"], "unknown mutant(s) ['no-such-bug']"),
        (["-m", "bench.protocols", "--config", "disagg_prefill"], "--config: ['disagg_prefill'] are not configurations the real scheduler runs"),
    ],
)
def test_a_bad_input_to_a_benchmark_is_one_line_and_exit_2(argv, message):
    assert_refused(run(*argv), message)


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--hypothesis-profile", "nonexistent"], {}, "--hypothesis-profile=nonexistent: unknown Hypothesis profile"),
        ([], {"HYPOTHESIS_PROFILE": "bogus"}, "HYPOTHESIS_PROFILE=bogus: unknown Hypothesis profile"),
        (["--cache-impl", "bogus"], {}, "--cache-impl must be 'impl', 'sglang', 'sglang-CORE' or MODULE:CLASS, got 'bogus'"),
        (["--cache-impl", "collections:OrderedDict"], {}, "--cache-impl collections:OrderedDict: <class"),
        (["--device", "bogus"], {}, "--device: not a torch device: 'bogus'"),
    ],
)
def test_a_bad_pytest_option_is_one_usage_error(argv, env, message):
    clean = {k: v for k, v in ENV.items() if k != "PYTEST_ADDOPTS"}  # CI's coverage options are not ours to test
    result = run("-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:cov", "-q",
                 "tests/test_free_list.py", *argv, env=dict(clean, **env))
    assert result.returncode == 4, result.stdout + result.stderr
    assert f"ERROR: {message}" in result.stderr and "INTERNALERROR" not in result.stderr + result.stdout


def test_a_trace_recorded_on_a_device_this_machine_lacks_replays_on_cpu_with_a_note(tmp_path):
    doc = json.loads(open(TRACE).read())
    doc["config"]["device"] = "cuda" if not torch.cuda.is_available() else "xpu"
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps(doc))
    result = run("-m", "harness", "replay", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == f"note: the trace was recorded on {doc['config']['device']}, which this machine lacks; replaying on cpu"
    assert "on cpu" in result.stdout.splitlines()[0]


def test_benchmarks_run_from_any_directory(tmp_path):
    result = run("-m", "bench.mutants", "--only", "evict-one-short", "--workers", "1", "--device", "cpu", cwd=tmp_path,
                 timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 seeded bugs caught" in result.stdout


def test_help_lists_the_choices_and_defaults():
    text = " ".join(run("-m", "harness", "fuzz", "--help").stdout.split())
    for expected in ("{dev,ci,nightly,mutation}", "default nightly", "{hypothesis,random}", "default hypothesis",
                     "decode_pressure", "default: one per core", "default 1"):
        assert expected in text, expected
    assert "With no command: `fuzz` with its defaults" in " ".join(run("-m", "harness", "--help").stdout.split())


def start_fuzz(tmp_path, *extra):
    """A fuzz in a process group of its own (as a terminal runs it), writing its report."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "fuzz", "--seconds", "120", "--profile", "ci", "--report", str(tmp_path / "r.json"),
         "--db", str(tmp_path / "db"), "--trace-dir", str(tmp_path / "traces"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV, start_new_session=True,
    )


def wait_for_steps(proc, tmp_path):
    """Until the run has made steps (its progress line shows some)."""
    for line in proc.stdout:
        if " steps " in line and " steps 0 " not in line:
            return
    pytest.fail("the fuzz ended before making any step")


@pytest.mark.parametrize(
    "signum, to_group, status",
    [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143)],
    ids=["ctrl-c-to-the-process-group", "sigterm-to-the-parent"],
)
def test_a_signal_stops_the_fuzz_with_its_summary_and_report(tmp_path, signum, to_group, status):
    proc = start_fuzz(tmp_path, "--workers", "2")
    try:
        wait_for_steps(proc, tmp_path)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(signum).name
    assert proc.returncode == status, out + err
    assert err == "", err
    assert "0 distinct failure(s)" in out and f"stopped early by {name}" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] == name and report["steps"] > 0 and report["failures"] == []
    if shutil.which("pgrep"):
        for _ in range(50):  # the workers and multiprocessing's helpers exit with the parent
            leftover = subprocess.run(["pgrep", "-a", "-g", str(proc.pid)], capture_output=True, text=True).stdout
            if not leftover:
                break
            time.sleep(0.1)
        assert leftover == "", f"processes left behind: {leftover}"
