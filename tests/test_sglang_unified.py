"""The harness pointed at SGLang's `UnifiedRadixCache` (Full + Mamba) on its Python and Rust tree
cores, and at both side by side (`harness.caches.sglang_unified`, `harness.caches.parity`).

Tests marked `sglang` skip when SGLang is not importable; these also skip, saying so, when the
installed release has no unified cache the harness drives (`scripts/install-sglang.sh 0.5.23`).
"""

import dataclasses
import functools
import json

import pytest
from packaging.version import Version
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.caches import cache_factory, cache_name, cache_release
from harness.caches.sglang_loader import sglang_unavailable, sglang_version
from harness.caches.sglang_releases import has_tree_cores, ships_mamba_radix_cache, unified_rules
from harness.driver import Driver, paused_gc
from harness.engines.hypothesis_engine import machine_for
from harness.findings import set_aside
from reference import SGLANG_0_5_20, SGLANG_UNIFIED, SGLANG_UNIFIED_0_5_20
from strategies import SCENARIOS
from strategies.config import CacheConfig

CONFIG = CacheConfig(kv_size=24, mamba_size=6, req_size=3, max_context_len=32)
CORES = ["python", "rust"]

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def needs_the_unified_cache():
    if not sglang_unavailable() and not has_tree_cores(sglang_version()):
        pytest.skip(f"needs a release whose UnifiedRadixCache has both tree cores (0.5.19 on); installed: {sglang_version()}")


def driver_for(impl: str) -> Driver:
    factory = cache_factory(impl)
    return Driver(CONFIG, cache_factory=factory, set_aside=set_aside(["all"], cache_release(factory)))


def serve(driver: Driver, *prompts) -> None:
    """Each prompt arrives and finishes at the end of its prefill; every check after each."""
    for prompt in prompts:
        driver.apply("arrive", tokens=list(prompt), extra_key=None, max_new_tokens=1)
        driver.apply("iterate", tokens=[0], transferred=0)
        driver.check()


@pytest.mark.parametrize("core", CORES)
def test_the_cache_under_test_is_the_unified_cache_on_the_named_core(core):
    cut = cache_factory(f"sglang-{core}")(CONFIG)
    sgl = cut.sgl
    assert type(cut.cache) is sgl.UnifiedRadixCache
    assert cut.cache.tree_components == (sgl.ComponentType.FULL, sgl.ComponentType.MAMBA)
    assert type(cut.cache.tree_core).__name__ == {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[core]
    assert type(cut.req_pool) is sgl.HybridReqToTokenPool and type(cut.kv) is sgl.TokenToKVPoolAllocator
    rules, protocol = release_rules(sgl.version)
    # the release's rules, whatever their name (`unified_rules` names them by release)
    assert (cut.name, cut.release, dataclasses.replace(cut.rules, name=rules.name), cut.default_protocol) == (f"sglang-{core}", sgl.version, rules, protocol)
    assert cut.opaque == (core == "rust")  # the Rust core's nodes cannot be read from Python


def test_plain_sglang_is_the_python_core_from_0_5_21_and_mamba_radix_cache_on_0_5_20():
    expected = "sglang" if ships_mamba_radix_cache(sglang_version()) else "sglang-python"
    assert cache_name(cache_factory("sglang")) == expected


def test_the_python_core_is_read_white_box():
    with paused_gc():
        driver = driver_for("sglang-python")
        serve(driver, [1, 2, 3], [1, 2, 4])
        snap = driver.cut.snapshot()
        assert sorted(p[1] for p in snap.nodes) == [(1, 2), (1, 2, 3), (1, 2, 4)]  # [1, 2] split off
        assert snap.nodes[(None, (1, 2))].mamba is None  # the upper part of a split holds no state
        assert sorted(len(p[1]) for p in snap.mamba_lru) == [3, 3] and snap.mamba_links_ok
        lru = driver.cut.cache.tree_core.lru_lists[driver.cut.MAMBA]
        first = lru.head.lru_next[lru._pt]
        first.lru_next[lru._pt].lru_prev[lru._pt] = lru.head  # break one back link
        assert not driver.cut.snapshot().mamba_links_ok
        first.lru_next[lru._pt].lru_prev[lru._pt] = first
        assert driver.cut.snapshot().mamba_links_ok


def test_the_rust_core_is_checked_from_outside():
    with paused_gc():
        driver = driver_for("sglang-rust")
        serve(driver, [1, 2, 3], [1, 2, 4])
        snap = driver.cut.snapshot()
        assert snap.nodes is None
        assert sorted(snap.tree_kv) == [1, 2, 3, 6] and len(snap.tree_mamba) == 2  # [1, 2] matched nothing: recomputed, its duplicates freed
        cut = driver.cut
        cut.kv.free(cut.indices([1]))  # a slot the tree holds handed back to the pool as well
        with pytest.raises(AssertionError, match="pool_conservation.*KV slot 1 is owned by both"):
            driver.check()


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("scenario", ["medium", "chunked", "decode_pressure", "disagg_prefill"])
def test_with_its_known_findings_set_aside_each_core_agrees_with_the_model(core, scenario, tmp_path):
    factory = cache_factory(f"sglang-{core}")
    machine = machine_for(SCENARIOS[scenario], factory, trace_dir=str(tmp_path), set_aside=set_aside(["all"], cache_release(factory)))
    run_state_machine_as_test(machine, settings=settings(max_examples=15, deadline=None, database=None))


def test_the_two_cores_agree_side_by_side(tmp_path):
    factory = cache_factory("sglang-parity")
    machine = machine_for(SCENARIOS["lock_heavy"], factory, trace_dir=str(tmp_path), set_aside=set_aside(["all"], cache_release(factory)))
    run_state_machine_as_test(machine, settings=settings(max_examples=10, deadline=None, database=None))


def test_parity_fails_at_the_first_difference_between_the_cores():
    with paused_gc():
        driver = driver_for("sglang-parity")
        serve(driver, [1, 2, 3])
        rust = driver.cut.rust
        rust.cache.evict_for_alloc(rust.sgl.EvictParams(num_tokens=3))  # the Rust core alone lets its tree go
        with pytest.raises(AssertionError, match=r"core_parity.*differs between the tree cores"):
            serve(driver, [1, 2, 3, 4])


# the two eras' unified rules and hand-written protocols, as the model names them
NAMED_RULES = {"0.5.23": (SGLANG_UNIFIED, "unified"), "0.5.20": (SGLANG_UNIFIED_0_5_20, "unified-0.5.20")}


def release_rules(version: str):
    """The release's unified rules and hand-written protocol: the named ones for 0.5.20 and
    0.5.23, the release table's (`unified_rules`) for the releases between and after them."""
    if version in NAMED_RULES:
        return NAMED_RULES[version]
    return unified_rules(version), "unified" if Version(version) >= Version("0.5.22") else "unified-0.5.20"


def masked(rules, rule: str) -> bool:
    """Whether the release's other rules make `rule` unobservable: where every insert from a
    request is followed by a match of what it inserted (`caching_rematches` and
    `finishing_rematches`, 0.5.22), that match refreshes the insert's end node as
    `insert_refreshes_end_state` would."""
    return rule == "insert_refreshes_end_state" and rules.caching_rematches and rules.finishing_rematches


def changed_rules(version: str):
    """(rule, the value put back): each observable rule in which this release's unified cache
    differs from MambaRadixCache (0.5.20's rules), or else from the other era's unified cache."""
    rules, protocol = release_rules(version)
    other_era = SGLANG_UNIFIED if protocol == "unified-0.5.20" else SGLANG_UNIFIED_0_5_20
    out = []
    for f in dataclasses.fields(rules):
        if f.name == "name" or masked(rules, f.name):
            continue
        for other in (SGLANG_0_5_20, other_era):
            if getattr(other, f.name) != getattr(rules, f.name):
                out.append((f.name, getattr(other, f.name)))
                break
    return out


def test_the_unified_rules_are_the_ones_the_source_shows():
    assert [name for name, _ in changed_rules("0.5.23")] == ["insert_refreshes_end_state", "kv_decides_node_survival", "caching_rematches"]
    assert changed_rules("0.5.20") == [("insert_refreshes_end_state", False), ("kv_decides_node_survival", False), ("caching_rematches", False)]


@pytest.mark.parametrize("index", range(3))
def test_each_unified_rule_is_needed_to_agree_with_it(index, tmp_path):
    """Model the installed release's unified cache with one of its rules put back as
    MambaRadixCache (or the other release's unified cache) has it: the harness must diverge (on
    the Python core, whose tree it reads)."""
    changed = changed_rules(sglang_version())
    if index >= len(changed):
        pytest.skip(f"SGLang {sglang_version()}'s unified cache differs in {len(changed)} observable rules: {changed}")
    rule, value = changed[index]
    factory = cache_factory("sglang-python")
    rules = dataclasses.replace(factory.func.release_rules(sglang_version()), **{rule: value})
    patched = type(f"UnifiedWithOther{rule}", (factory.func,), {"release_rules": classmethod(lambda cls, version: rules)})
    old_factory = functools.partial(patched, tree_core="python")
    known = set_aside(["all"], cache_release(factory))
    machine = machine_for(SCENARIOS["medium"], old_factory, trace_dir=str(tmp_path), set_aside=known)
    with pytest.raises(Exception, match="lru_lists|trees_equal|pool_conservation|differs"):
        found_at_all = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate], derandomize=True)
        run_state_machine_as_test(machine, settings=found_at_all)


def test_the_workload_benchmark_serves_every_request_through_both_cores(tmp_path):
    from bench import workload

    if sglang_version() != "0.5.23":
        pytest.skip(f"the benchmark drives 0.5.23's unified cache (installed: {sglang_version()})")
    out = tmp_path / "workload.json"
    argv = ["--caches", "impl", "sglang-python", "sglang-rust", "--conversations", "6", "--repeats", "1", "--nodes", "60"]
    assert workload.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    python, rust = result["throughput"]["sglang-python"], result["throughput"]["sglang-rust"]
    assert python["reused_tokens"] > 0
    # the same calls on the two cores reuse and evict the same tokens
    assert (python["reused_tokens"], python["evicted_tokens"]) == (rust["reused_tokens"], rust["evicted_tokens"])
    assert set(result["operations"]["sglang-rust"]["60"]["median_us"]) == {"match", "match + lock + unlock", "insert", "evict"}

