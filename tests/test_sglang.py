"""The harness pointed at SGLang's own MambaRadixCache and pools (`harness.caches.sglang_0_5_*`;
the unified cache has `test_sglang_unified.py`).

Tests marked `sglang` skip, saying why, when SGLang is not importable; install it with
`scripts/install-sglang.sh 0.5.4`. `pytest --cache-impl sglang` runs the whole state machine
(the release's known findings set aside) and every regression trace against SGLang as well.
"""

import dataclasses

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.caches import cache_factory, cache_release
from harness.caches.sglang_loader import VirtualClock, sglang_unavailable, sglang_version
from harness.caches.sglang_releases import ships_mamba_radix_cache
from harness.driver import Driver, paused_gc
from harness.engines.hypothesis_engine import machine_for
from harness.findings import set_aside
from reference import SGLANG_0_5_4, SGLANG_0_5_20
from strategies import SCENARIOS
from strategies.config import CacheConfig

CONFIG = CacheConfig(kv_size=24, mamba_size=6, req_size=2, max_context_len=32)


def needs_mamba_radix_cache() -> None:
    if not ships_mamba_radix_cache(sglang_version()):
        pytest.skip(f"needs a release that ships MambaRadixCache (0.5.3.post2 .. 0.5.20); installed: {sglang_version()}")


@pytest.mark.skipif(not sglang_unavailable(), reason="SGLang is installed here")
def test_asking_for_sglang_without_it_names_the_install_command():
    with pytest.raises(ValueError, match="--impl sglang: SGLang cannot be imported .*install-sglang"):
        cache_factory("sglang")


@pytest.mark.sglang
def test_the_cache_under_test_is_sglangs_own_pools_and_cache():
    needs_mamba_radix_cache()
    cut = cache_factory("sglang")(CONFIG)
    sgl = cut.sgl
    assert type(cut.cache) is sgl.MambaRadixCache
    assert type(cut.req_pool) is sgl.HybridReqToTokenPool
    assert type(cut.kv) is sgl.TokenToKVPoolAllocator
    assert cut.mamba_pool is cut.req_pool.mamba_pool
    assert cut.release == sgl.version
    assert cut.rules.name == sgl.version  # the model follows the installed release's deliberate rules
    # 0.5.4 runs under its own scheduler; 0.5.20's scheduler is not transcribed (the contract)
    assert cut.default_protocol == {"0.5.4": "sglang-0.5.4", "0.5.20": "contract"}[sgl.version]


@pytest.mark.sglang
def test_the_checks_read_sglangs_lists_and_states():
    needs_mamba_radix_cache()
    with paused_gc():
        factory = cache_factory("sglang")
        driver = Driver(CONFIG, cache_factory=factory, set_aside=set_aside(["all"], cache_release(factory)))
        for prompt in ([1, 2, 3], [1, 2, 4]):  # each finishes at the end of its prefill
            driver.apply("arrive", tokens=prompt, extra_key=None, max_new_tokens=1)
            driver.apply("iterate", tokens=[0], transferred=0)
        driver.check()
        cut = driver.cut
        assert sorted(len(p[1]) for p in cut.snapshot().full_lru) == [2, 3, 3]  # [1, 2] split off
        lru = cut.cache.full_lru_list
        first = getattr(lru.head, lru.nxt)
        setattr(getattr(first, lru.nxt), lru.prv, lru.head)  # break one back link
        assert not cut.read_lru("full")[1]
        setattr(getattr(first, lru.nxt), lru.prv, first)
        assert cut.read_lru("full")[1]
        computed = [i for i, value in enumerate(cut.state_digests()) if value]  # free slots read 0
        assert len(computed) == 2
        slot = computed[0]
        cut.mamba_tensors()[-1][:, slot] = 1234.0  # one state tensor no longer holds the digest
        assert cut.state_digests()[slot] is None


@pytest.mark.sglang
def test_sglang_0_5_4s_tree_reads_the_virtual_clock():
    if sglang_version() != "0.5.4":
        pytest.skip(f"needs SGLang 0.5.4 (installed: {sglang_version()})")
    cut = cache_factory("sglang")(CONFIG)
    assert isinstance(cut.sgl.cache_module.time, VirtualClock)
    before = cut.clock.now
    cut.advance_clock(0.01)
    assert cut.sgl.cache_module.time.monotonic() == pytest.approx(before + 0.01 + VirtualClock.STEP)


@pytest.mark.sglang
@pytest.mark.parametrize("scenario", ["medium", "chunked", "decode_pressure"])
def test_with_its_known_findings_set_aside_sglang_agrees_with_the_model(scenario, tmp_path):
    factory = cache_factory("sglang")
    known = set_aside(["all"], cache_release(factory))
    machine = machine_for(SCENARIOS[scenario], factory, trace_dir=str(tmp_path), set_aside=known)
    run_state_machine_as_test(machine, settings=settings(max_examples=20, deadline=None, database=None))


def test_a_placeholder_package_imports_at_any_depth_and_raises_when_called():
    import importlib
    import sys

    from harness.caches.sglang_loader import _PlaceholderFinder, _placeholder

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

    from harness.caches.sglang_loader import _PlaceholderFinder, _placeholder

    _placeholder("json")
    assert not any(isinstance(f, _PlaceholderFinder) and f.package == "json" for f in sys.meta_path)


@pytest.mark.sglang
def test_a_placeholder_stands_in_for_a_missing_torchvision():
    import torchvision.transforms as transforms

    if not type(transforms).__name__ == "_Unavailable":
        pytest.skip("torchvision is installed here")
    with pytest.raises(ImportError, match="torchvision.transforms.ToTensor: torchvision is not installed"):
        transforms.ToTensor()


# each rule 0.5.20 changed; the one only a direct `insert` shows (SGLang's scheduler paths free
# the same duplicate slots whichever frees them) has a test of its own below
CHANGED_IN_0_5_20 = [
    f.name
    for f in dataclasses.fields(SGLANG_0_5_20)
    if f.name not in ("name", "insert_frees_duplicate_kv") and getattr(SGLANG_0_5_20, f.name) != getattr(SGLANG_0_5_4, f.name)
]


@pytest.mark.sglang
def test_0_5_20s_insert_frees_the_callers_duplicate_kv_itself():
    """`insert_frees_duplicate_kv`: inserting a cached key again gives the caller's KV slots for
    it back to the pool inside `insert` (0.5.4 left them to the caller)."""
    if sglang_version() != "0.5.20":
        pytest.skip(f"needs SGLang 0.5.20 (installed: {sglang_version()})")
    cut = cache_factory("sglang")(CONFIG)
    for _ in range(2):
        kv, mamba = cut.kv_alloc(3), cut.mamba_alloc(1)
        prefix_len, _ = cut.insert(cut.key([1, 2, 3], None), kv, mamba)
    assert prefix_len == 3
    assert cut.kv_available() == CONFIG.kv_size - 3


@pytest.mark.sglang
@pytest.mark.parametrize("rule", CHANGED_IN_0_5_20)
def test_each_rule_0_5_20_changed_is_needed_to_agree_with_it(rule, tmp_path):
    """Model 0.5.20 with one of its rules put back as 0.5.4 had it: the harness must diverge."""
    if sglang_version() != "0.5.20":
        pytest.skip(f"needs SGLang 0.5.20 (installed: {sglang_version()})")
    factory = cache_factory("sglang")
    rules = dataclasses.replace(factory.release_rules("0.5.20"), **{rule: getattr(SGLANG_0_5_4, rule)})
    with_old_rule = type(f"{factory.__name__}With054{rule}", (factory,), {"release_rules": classmethod(lambda cls, version: rules)})
    known = set_aside(["all"], cache_release(factory))
    machine = machine_for(SCENARIOS["medium"], with_old_rule, trace_dir=str(tmp_path), set_aside=known)
    with pytest.raises(Exception, match="lru_lists|pool_conservation|differs"):
        found_at_all = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate], derandomize=True)
        run_state_machine_as_test(machine, settings=found_at_all)
