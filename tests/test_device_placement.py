"""Every tensor impl, the harness, the benchmarks and the example make names its device.

On `cuda`, a tensor made without naming its device lands on torch's default device, the host,
and the first operation that meets a pool's tensors fails (or copies behind the caller's back).
CI has no GPU, so these tests make torch's default device `meta`, a device that holds no data,
while the pools run on the test device: a tensor made without naming its device is then a `meta`
tensor, and reading it or mixing it with the pools' tensors fails at once. A GPU is still needed
for what this cannot show: the kernels themselves and the host/device synchronisation
(`scripts/gpu-check.sh` runs the same commands on `cuda`).
"""

import functools
import random

import pytest
import torch

import impl
from bench import engines, throughput, workload
from harness.caches import ImplCache
from harness.engines.random_engine import ProgramFailed, random_program
from strategies import SCENARIOS
from harness.trace import load_trace
from test_regressions import TRACES, replay_problem, skip_unreplayable, trace_id
from test_scheduler_demo import load_demo

PROGRAMS, STEPS = 6, 60


def no_default_device():
    """Within it, a tensor made without naming its device holds no data."""
    return torch.device("meta")


def run_random_programs(cache_factory, device, config, trace_dir) -> None:
    """Seeded random programs of one configuration; `ProgramFailed` at the first failure."""
    rng = random.Random(20261205)
    with no_default_device():
        for _ in range(PROGRAMS):
            random_program(SCENARIOS[config], cache_factory, rng, STEPS, str(device), str(trace_dir))


@pytest.mark.parametrize("config", sorted(SCENARIOS))
def test_random_programs_make_every_tensor_on_the_pools_device(config, device, tmp_path):
    try:
        run_random_programs(ImplCache, device, config, tmp_path)
    except ProgramFailed as failed:
        pytest.fail(
            f"a program failed with torch's default device set to meta, so most likely a tensor was "
            f"made without naming its device: [{failed.check}] {failed.message}\nits shrunk program: {failed.path}"
        )


class EmptyMatchOnTheHost(impl.MambaRadixCache):
    """A cache whose empty match results are made on the default device, not the pools' device."""

    def _empty_indices(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64)


def test_a_tensor_made_without_its_device_fails_the_programs(device, tmp_path):
    with pytest.raises(ProgramFailed, match="meta"):
        run_random_programs(functools.partial(ImplCache, cache_class=EmptyMatchOnTheHost), device, "tiny", tmp_path)


@pytest.mark.parametrize("path", TRACES, ids=trace_id)
def test_regression_traces_replay_without_the_default_device(path, device):
    skip_unreplayable(load_trace(path), ImplCache)
    with no_default_device():
        problem = replay_problem(path, ImplCache, device)
    if problem:
        pytest.fail(f"{path} {problem}")


def test_benchmark_commands_make_every_tensor_on_their_device(device, capsys):
    argv = ["--device", str(device)]
    with no_default_device():
        assert engines.main(["--rounds", "1", "--seconds", "0.3", "--config", "tiny", *argv]) == 0
        assert throughput.main(["--seconds", "0.3", "--sizes", "tens", *argv]) == 0
        assert workload.main(["--caches", "impl", "--conversations", "6", "--repeats", "1", "--nodes", "60", *argv]) == 0
    assert "requests/s" in capsys.readouterr().out


def test_scheduler_demo_makes_every_tensor_on_its_device(device):
    with no_default_device():
        summary = load_demo().main(["--device", str(device), "--conversations", "3", "--turns", "2"])
    assert summary["tree KV tokens"] + summary["free KV slots"] == 400
