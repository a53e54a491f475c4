"""The benchmark commands run end to end at tiny sizes, on the device they are given, and refuse a
device they cannot use by name. No figure is judged here: speed is measured by the commands
themselves, never by a timed test."""

import json

import pytest

from bench import engines, throughput, workload

COMMANDS = [engines.main, throughput.main, workload.main]


@pytest.mark.parametrize("main", COMMANDS, ids=lambda m: m.__module__)
def test_a_device_that_cannot_be_used_is_refused_by_name(main, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "tpu:7"])
    assert exit_info.value.code == 2
    assert "tpu:7" in capsys.readouterr().err


def test_engines_runs_both_engines_on_the_device(tmp_path, device):
    out = tmp_path / "engines.json"
    assert engines.main(["--rounds", "1", "--seconds", "0.5", "--config", "tiny", "--device", str(device),
                         "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == str(device)
    assert all(rates[0] > 0 for rates in result["steps_per_second"].values())


def test_throughput_measures_the_three_machines(tmp_path, device):
    out = tmp_path / "throughput.json"
    assert throughput.main(["--seconds", "0.5", "--sizes", "tens", "--device", str(device), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["bare_steps_per_second"] > 0 and row["hypothesis_steps_per_second"] > 0
    assert row["random_steps_per_second"] > 0


def test_workload_serves_every_request_through_impl(tmp_path, device):
    out = tmp_path / "workload.json"
    assert workload.main(["--caches", "impl", "--conversations", "6", "--repeats", "1", "--nodes", "60",
                          "--device", str(device), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    served = result["throughput"]["impl"]
    assert result["workload"]["requests"] == 24 and served["requests_per_second"] > 0
    assert served["reused_tokens"] > 0
