"""The harness pointed at SGLang's own MambaRadixCache and pools (`harness.sglang_adapter`).

Tests marked `sglang` skip, saying why, when SGLang is not importable; install it with
`scripts/install-sglang.sh 0.5.4`. `pytest --cache-impl sglang` runs the whole state machine
and every regression trace against SGLang as well.
"""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.adapters import adapter_for
from harness.config import CacheConfig
from harness.driver import PairedScheduler
from harness.machine import machine_for
from harness.sglang_adapter import sglang_unavailable
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
    assert not adapter.lru_links_ok("full")
    setattr(getattr(first, lru.nxt), lru.prv, first)
    assert adapter.lru_links_ok("full")
    slot = int(adapter.cache.mamba_lru_list.head.mamba_next.mamba_value[0])
    adapter.mamba_pool.mamba_cache.conv[:, slot] = 1234.0
    assert adapter.mamba_states()[slot] is None


@pytest.mark.sglang
def test_a_placeholder_stands_in_for_a_missing_torchvision():
    import torchvision.transforms as transforms

    if not type(transforms).__name__ == "_Unavailable":
        pytest.skip("torchvision is installed here")
    with pytest.raises(ImportError, match="torchvision.transforms.ToTensor: .* is not installed"):
        transforms.ToTensor
