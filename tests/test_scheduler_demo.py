"""The scheduler-like example runs end to end and leaves the pools conserved."""

import importlib.util
import os

import pytest

HERE = os.path.dirname(__file__)


def load_demo():
    path = os.path.join(HERE, "..", "examples", "scheduler_demo.py")
    spec = importlib.util.spec_from_file_location("scheduler_demo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scheduler_demo_reuses_prefixes_and_conserves_slots(device, capsys):
    summary = load_demo().main(["--device", str(device), "--conversations", "4", "--turns", "3"])
    assert summary["requests"] == 12
    assert summary["prefix tokens reused"] > 0
    assert summary["tree KV tokens"] + summary["free KV slots"] == 400
    assert summary["tree Mamba states"] + summary["free Mamba slots"] == 12
    assert "prefix tokens reused" in capsys.readouterr().out


@pytest.mark.gpu
def test_scheduler_demo_on_cuda():
    summary = load_demo().main(["--device", "cuda", "--conversations", "3", "--turns", "2"])
    assert summary["tree KV tokens"] + summary["free KV slots"] == 400
