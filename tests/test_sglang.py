"""The harness pointed at SGLang's own MambaRadixCache and pools (`harness.sglang_adapter`).

Tests marked `sglang` skip, saying why, when SGLang is not importable; install it with
`scripts/install-sglang.sh 0.5.4`. `pytest --cache-impl sglang` runs the whole state machine
and every regression trace against SGLang as well.
"""

import dataclasses

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.adapters import adapter_for
from harness.config import CacheConfig
from harness.driver import PairedScheduler
from harness.machine import machine_for
from harness.sglang_adapter import sglang_unavailable, sglang_version
from reference import SGLANG_0_5_4, SGLANG_0_5_20
from strategies import SCENARIOS


CONFIG = CacheConfig(kv_size=24, mamba_size=4, req_size=2, max_context_len=32)


@pytest.mark.skipif(not sglang_unavailable(), reason="SGLang is installed here")
def test_asking_for_sglang_without_it_names_the_install_command():
    with pytest.raises(ValueError, match="--impl sglang: SGLang cannot be imported .*install-sglang"):
        adapter_for("sglang")


@pytest.mark.sglang
@pytest.mark.parametrize("scenario", ["medium", "chunked", "lock_heavy"])
def test_sglang_agrees_with_the_model(scenario):
    machine = machine_for(SCENARIOS[scenario], adapter_for("sglang"))
    run_state_machine_as_test(machine, settings=settings(max_examples=20, deadline=None))


@pytest.mark.sglang
def test_the_adapter_builds_sglangs_own_pools_and_cache():
    adapter = adapter_for("sglang")(CONFIG)
    sgl = adapter.sgl
    assert type(adapter.cache) is sgl.MambaRadixCache
    assert type(adapter.req_pool) is sgl.HybridReqToTokenPool
    assert type(adapter.kv) is sgl.TokenToKVPoolAllocator
    assert adapter.mamba_pool is adapter.req_pool.mamba_pool
    assert adapter.version() == sgl.version
    assert adapter.rules.name == sgl.version  # the model follows the installed release's rules


@pytest.mark.sglang
def test_the_checks_read_sglangs_lists_and_states():
    driver = PairedScheduler(CONFIG, adapter_for("sglang"))
    driver.insert([1, 2, 3])
    driver.insert([1, 2, 4])
    driver.check()
    adapter = driver.adapter
    assert [len(p[1]) for p in adapter.snapshot().full_lru] == [3, 3, 2]
    lru = adapter.cache.full_lru_list
    first = getattr(lru.head, lru.nxt)
    setattr(getattr(first, lru.nxt), lru.prv, lru.head)  # break one back link
    assert not adapter.read_lru("full")[1]
    setattr(getattr(first, lru.nxt), lru.prv, first)
    assert adapter.read_lru("full")[1]
    slot = int(adapter.cache.mamba_lru_list.head.mamba_next.mamba_value[0])
    conv = adapter.mamba_tensors()[-1]
    conv[:, slot] = 1234.0
    assert adapter.mamba_states()[slot] is None


def test_a_placeholder_package_imports_at_any_depth_and_raises_when_called():
    import importlib
    import sys

    from harness.sglang_adapter import _PlaceholderFinder, _placeholder

    _placeholder("harness_absent_pkg")
    try:
        from harness_absent_pkg.io import decode_jpeg  # a from-import of a name, two levels down

        module = importlib.import_module("harness_absent_pkg.transforms.functional")
        assert repr(module.InterpolationMode.NEAREST) == "<placeholder for harness_absent_pkg.transforms.functional.InterpolationMode.NEAREST>"
        with pytest.raises(ImportError, match=r"harness_absent_pkg\.io\.decode_jpeg: harness_absent_pkg is not installed"):
            decode_jpeg(b"")
        _placeholder("harness_absent_pkg")  # a second call adds no second finder
        assert sum(isinstance(f, _PlaceholderFinder) and f.package == "harness_absent_pkg" for f in sys.meta_path) == 1
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "package", None) != "harness_absent_pkg"]
        for name in [n for n in sys.modules if n.split(".")[0] == "harness_absent_pkg"]:
            del sys.modules[name]


def test_an_installed_package_gets_no_placeholder():
    import sys

    from harness.sglang_adapter import _PlaceholderFinder, _placeholder

    _placeholder("json")
    assert not any(isinstance(f, _PlaceholderFinder) and f.package == "json" for f in sys.meta_path)


@pytest.mark.sglang
def test_a_placeholder_stands_in_for_a_missing_torchvision():
    import torchvision.transforms as transforms

    if not type(transforms).__name__ == "_Unavailable":
        pytest.skip("torchvision is installed here")
    with pytest.raises(ImportError, match="torchvision.transforms.ToTensor: torchvision is not installed"):
        transforms.ToTensor()


CHANGED_IN_0_5_20 = [
    f.name
    for f in dataclasses.fields(SGLANG_0_5_20)
    if f.name != "name" and getattr(SGLANG_0_5_20, f.name) != getattr(SGLANG_0_5_4, f.name)
]


@pytest.mark.sglang
@pytest.mark.parametrize("rule", CHANGED_IN_0_5_20)
def test_each_rule_0_5_20_changed_is_needed_to_agree_with_it(rule, tmp_path):
    """Model 0.5.20 with one of its rules put back as 0.5.4 had it: the harness must diverge."""
    if sglang_version() != "0.5.20":
        pytest.skip(f"needs SGLang 0.5.20 (installed: {sglang_version()})")
    adapter = adapter_for("sglang")
    rules = dataclasses.replace(adapter.rules, **{rule: getattr(SGLANG_0_5_4, rule)})
    with_old_rule = type(f"{adapter.__name__}With054{rule}", (adapter,), {"rules": rules})
    machine = machine_for(SCENARIOS["medium"], with_old_rule, trace_dir=str(tmp_path))
    with pytest.raises(Exception, match="lru_lists|pool_conservation|data_integrity|differs"):
        found_at_all = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate])
        run_state_machine_as_test(machine, settings=found_at_all)
