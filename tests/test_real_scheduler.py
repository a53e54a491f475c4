"""SGLang 0.5.23's own `Scheduler` built on CPU with the stand-in worker
(`harness.real_scheduler.sglang_0_5_23`): requests go through its real event loop, the stand-in
forward pass checks every resumed Mamba state, SGLang's invariant checker runs strict where the
scheduler runs it, and every slot comes back once the requests are done.

Skips, saying so, unless SGLang 0.5.23 is installed (CI has no SGLang).
"""

import pytest

from harness.caches.sglang_loader import sglang_unavailable, sglang_version
from strategies.config import CacheConfig, SchedulerConfig

pytestmark = pytest.mark.sglang

CONFIG = CacheConfig(kv_size=64, mamba_size=8, req_size=4)


@pytest.fixture(scope="module")
def real():
    reason = sglang_unavailable()
    if reason:
        pytest.skip(reason)
    if sglang_version() != "0.5.23":
        pytest.skip(f"the real scheduler is built for SGLang 0.5.23; installed: {sglang_version()}")
    from harness.caches.sglang_unified import SglangUnifiedCache
    from harness.real_scheduler.sglang_0_5_23 import RealScheduler

    return RealScheduler(SglangUnifiedCache(CONFIG), CONFIG, SchedulerConfig(chunked_prefill_size=4, eos_token_id=99))


def test_requests_run_to_the_end_and_give_everything_back(real):
    cut = real.cut
    real.arrive("a", [1, 2, 3, 4, 5, 6], None, 3)
    real.arrive("b", [1, 2, 3, 9], None, 2)
    for _ in range(12):
        real.turn([7, 8])
    assert real.live_requests() == []
    # what the idle invariant checker counts, read here too: nothing leaked, the tree holds the rest
    full_evictable, _, mamba_evictable, _ = cut.sizes()
    assert cut.kv_available() + full_evictable == CONFIG.kv_size
    assert cut.mamba_available() + mamba_evictable == CONFIG.mamba_size
    assert cut.req_available() == CONFIG.req_size
    # a later request sharing the prefix resumes from the cached state (the forward pass checks it)
    real.arrive("c", [1, 2, 3, 4, 5, 6, 10], None, 1)
    for _ in range(4):
        real.turn([99])
    assert real.live_requests() == []


def test_abort_and_flush_through_the_receive_socket(real):
    real.arrive("d", [4, 4, 4, 4, 4, 4, 4, 4], None, 50)
    real.turn([5])
    real.abort("d")
    for _ in range(3):
        real.turn([5])
    assert real.live_requests() == []
    real.flush()
    assert real.cut.kv_available() == CONFIG.kv_size
    assert real.cut.sizes() == (0, 0, 0, 0)


def test_a_wrong_resumed_state_is_a_meaning_failure(real):
    from harness.checks.violation import InvariantViolation

    real.arrive("e", [3, 1, 4, 1, 5], None, 1)
    for _ in range(3):
        real.turn([99])
    assert real.live_requests() == []
    # corrupt the state the tree holds for the prefix, then ask for it again
    for slot in range(real.config.mamba_size):
        real.cut.write_state(slot, 12345)
    real.arrive("f", [3, 1, 4, 1, 5, 9], None, 1)
    with pytest.raises(InvariantViolation, match="resumes after"):
        for _ in range(3):
            real.turn([99])
