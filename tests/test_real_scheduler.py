"""The installed SGLang release's own `Scheduler` built on CPU with the stand-in worker
(`harness.real_scheduler`): requests go through its real event loop, the stand-in forward pass
checks every resumed Mamba state, SGLang's invariant checker runs strict where the scheduler runs
it, and every slot comes back once the requests are done; under `--protocol scheduler` the model
sees every call it makes.

Skips, saying so, unless a release the real scheduler is built for (0.5.16 .. 0.5.23) is installed
(CI has no SGLang).
"""

import pytest

from harness.caches.sglang_loader import sglang_unavailable, sglang_version
from strategies.config import CacheConfig, SchedulerConfig

pytestmark = pytest.mark.sglang

CONFIG = CacheConfig(kv_size=64, mamba_size=8, req_size=4)


def tree_cores() -> tuple:
    """The installed release's unified cache on each tree core it ships (the Python one alone
    before 0.5.19)."""
    from harness.caches.sglang_releases import has_tree_cores

    return ("sglang-python", "sglang-rust") if has_tree_cores(sglang_version()) else ("sglang-python",)


@pytest.fixture(scope="module")
def real():
    reason = sglang_unavailable()
    if reason:
        pytest.skip(reason)
    from harness.caches import cache_factory
    from harness.real_scheduler import RELEASES, real_scheduler_class

    if sglang_version() not in RELEASES:
        pytest.skip(f"the real scheduler is built for SGLang {sorted(RELEASES)}; installed: {sglang_version()}")
    RealScheduler = real_scheduler_class(sglang_version())

    return RealScheduler(cache_factory("sglang-python")(CONFIG), CONFIG, SchedulerConfig(chunked_prefill_size=4, eos_token_id=99))


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


# ----- the protocol: the real scheduler driving the cache, the model paired with it -------------


@pytest.fixture
def factory(real):
    from harness.caches import cache_factory

    return cache_factory("sglang-python")


def scheduler_driver(factory, **kwargs):
    from harness.driver import Driver

    return Driver(CONFIG, SchedulerConfig(chunked_prefill_size=4, eos_token_id=99), factory, protocol="scheduler", **kwargs)


def run_program(driver, steps):
    driver.check()
    for op, args in steps:
        driver.apply(op, **args)
        driver.check()


PROGRAM = [
    ("arrive", {"tokens": [1, 2, 3, 4, 5, 6], "extra_key": None, "max_new_tokens": 3}),
    ("arrive", {"tokens": [1, 2, 3, 9], "extra_key": None, "max_new_tokens": 2}),
    *[("iterate", {"tokens": [7, 8], "transferred": 0})] * 5,
    ("arrive", {"tokens": [1, 2, 3, 4, 5, 6, 7, 11], "extra_key": "lora-a", "max_new_tokens": 6}),
    ("iterate", {"tokens": [7], "transferred": 0}),
    ("abort", {"rid": 2}),
    *[("iterate", {"tokens": [99], "transferred": 0})] * 2,
    ("flush", {}),
]


def test_the_model_sees_every_call_the_real_scheduler_makes(factory):
    from harness.findings import set_aside

    driver = scheduler_driver(factory, set_aside=set_aside(["all"], sglang_version()))
    seen = []
    driver.on_event = seen.append
    run_program(driver, PROGRAM[:7])
    # the finished requests went into the model's tree through the mirrored release_kv_cache
    assert driver.model.nodes and driver.protocol.live_requests() == []
    assert driver.model.sizes() == driver.cut.sizes()
    run_program(driver, PROGRAM[7:])
    assert driver.model.nodes == {}  # the flush reached the model


def test_a_second_program_finds_the_scheduler_as_a_fresh_build(factory):
    from harness.findings import set_aside
    from harness.protocols.scheduler import RUNTIMES

    aside = set_aside(["all"], sglang_version())
    first = scheduler_driver(factory, set_aside=aside)
    first.apply("arrive", tokens=[4, 4, 4, 4, 4], extra_key=None, max_new_tokens=9)
    first.apply("iterate", tokens=[5], transferred=0)  # a program that ends with a request running
    runtime = RUNTIMES.of(first.cut)
    second = scheduler_driver(factory, set_aside=aside)
    assert RUNTIMES.of(second.cut) is runtime  # reset, not rebuilt
    assert second.cut.sizes() == (0, 0, 0, 0) and second.cut.all_free()
    assert second.cut.kv_data() == [0] * (CONFIG.kv_size + 1)
    run_program(second, PROGRAM)


def test_a_cache_handing_out_other_slots_than_the_model_is_a_divergence(factory):
    from harness.pairing import Divergence

    driver = scheduler_driver(factory)
    driver.cut.kv.free_pages = driver.cut.kv.free_pages.flip(0)  # the allocator's order corrupted
    driver.apply("arrive", tokens=[1, 2, 3], extra_key=None, max_new_tokens=2)
    with pytest.raises(Divergence, match="token_to_kv_pool_allocator.alloc"):
        driver.apply("iterate", tokens=[5], transferred=0)


def test_a_recorded_program_replays_to_the_same_failure_in_a_fresh_process(factory, tmp_path):
    import subprocess
    import sys

    from harness.trace import failure_trace, save_trace

    driver = scheduler_driver(factory)  # nothing set aside: the known own_storage finding fails it
    with pytest.raises(Exception) as failed:
        run_program(driver, PROGRAM)
    trace = failure_trace(driver, failed.value, "test")
    assert trace.protocol == "scheduler" and trace.failure.check == "own_storage"
    path = save_trace(trace, str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "harness", "replay", path], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"FAILED at step {trace.failure.step}: check 'own_storage' broke" in result.stdout


def test_the_fuzz_leaves_out_settings_the_real_scheduler_cannot_run(real):
    from harness.fuzz.options import FuzzOptions

    options = FuzzOptions(impl="sglang-python", protocol="scheduler", configs=["medium", "disagg_prefill"], device="cpu")
    options.check()
    assert (options.configs, options.left_out) == (["medium"], ["disagg_prefill"])
    with pytest.raises(ValueError, match="runs none of"):
        FuzzOptions(impl="sglang-python", protocol="scheduler", configs=["disagg_prefill"], device="cpu").check()


def test_the_real_scheduler_is_the_default_protocol_of_its_release(factory):
    from harness.caches import cache_factory, default_protocol

    assert all(default_protocol(cache_factory(core)) == "scheduler" for core in tree_cores())
    if len(tree_cores()) > 1:  # no scheduler drives two trees
        assert default_protocol(cache_factory("sglang-parity")) in ("unified", "unified-0.5.20")


# ----- impl registered as the radix cache of SGLang's own scheduler -----------------------------


def speaks_impl() -> bool:
    """Whether impl's tree speaks the installed release's tree-cache API (0.5.22 on)."""
    from harness.caches.impl_in_sglang import SPEAKS

    return sglang_version() in SPEAKS


def test_impl_runs_as_the_radix_cache_of_the_real_scheduler(real):
    if not speaks_impl():
        pytest.skip(f"impl's tree speaks 0.5.22's tree-cache API, not SGLang {sglang_version()}'s")
    import impl
    from harness.caches import cache_factory
    from harness.caches.impl_in_sglang import ImplInSglangCache

    driver = scheduler_driver(cache_factory("impl"))  # nothing set aside: impl has no known finding
    assert isinstance(driver.cut, ImplInSglangCache) and type(driver.cut.tree) is impl.MambaRadixCache
    run_program(driver, PROGRAM[:7])
    assert driver.model.nodes and driver.protocol.live_requests() == []
    assert driver.model.sizes() == driver.cut.sizes() != (0, 0, 0, 0)
    run_program(driver, PROGRAM[7:])
    assert driver.cut.sizes() == (0, 0, 0, 0) and driver.model.nodes == {}


def test_a_planted_bug_in_impl_fails_inside_the_real_scheduler(real):
    if not speaks_impl():
        pytest.skip(f"impl's tree speaks 0.5.22's tree-cache API, not SGLang {sglang_version()}'s")
    from harness.caches import cache_factory
    from harness.checks.violation import InvariantViolation

    # finishing a request frees the last KV slot of the prefix it shares with the tree as well
    driver = scheduler_driver(cache_factory("tests.broken_impls:KVSlotFreedTwice"))
    with pytest.raises(InvariantViolation) as failed:
        run_program(driver, PROGRAM)
    assert failed.value.check in {"sglang_self_check", "pool_conservation"}, failed.value


# ----- the unified era's regression traces, replayed under the release's own scheduler ----------


def _unified_era_traces():
    import glob
    import os

    from harness.trace import load_trace

    here = os.path.join(os.path.dirname(__file__), "regressions")
    paths = sorted(glob.glob(os.path.join(here, "**", "*.json"), recursive=True))
    return [os.path.relpath(p, here) for p in paths if load_trace(p).protocol in ("unified", "unified-0.5.20", "scheduler")]


@pytest.mark.parametrize("name", _unified_era_traces())
def test_a_unified_era_trace_keeps_its_verdict_under_the_real_scheduler(real, name):
    """Recorded under the hand-written calls of 0.5.20 or 0.5.23 (or under the scheduler
    itself): under the installed release's own scheduler it fails with the check it recorded on
    the Python core, and on every tree core (impl's inside it too) where it records a fault of a
    scheduler this release shares; elsewhere (the Rust core, 0.5.19 on; impl inside, 0.5.22 on)
    it passes, as it does everywhere when it records a fault of an older release's scheduler that
    this release fixed. A cache that cannot take the trace's settings is passed over."""
    import os

    from harness.caches import cache_factory
    from harness.protocols import RealSchedulerProtocol
    from harness.trace import load_trace, replay, scheduler_fault

    trace = load_trace(os.path.join(os.path.dirname(__file__), "regressions", name))
    if trace.scheduler.disaggregation_mode != "null":
        pytest.skip("recorded with disaggregated prefill, which the real scheduler does not build "
                    "(its finding has a scheduler-recorded trace, sglang-0.5.23/scheduler-*.json)")
    every_core = scheduler_fault(trace, sglang_version()) is not None
    # a fault of an older release's scheduler, fixed in this one: passes on every cache here
    fixed_here = scheduler_fault(trace) is not None and not every_core
    for cache in tree_cores() + (("impl",) if speaks_impl() else ()):
        factory = cache_factory(cache)
        if RealSchedulerProtocol.refusal(factory, trace.scheduler, trace.config):
            continue
        verdict = replay(trace, factory, protocol="scheduler")
        if not fixed_here and (cache == "sglang-python" or every_core):
            assert not verdict.ok and verdict.failure.check == trace.failure.check, (cache, verdict)
        else:
            assert verdict.ok, (cache, verdict)


# ----- the extra buffer (`--mamba-strategy extra_buffer`) -----------------------------------------


def extra_buffer_driver(factory, chunk=6, event_loop="normal"):
    from harness.caches import cache_class
    from harness.driver import Driver
    from harness.findings import set_aside

    if "extra_buffer" not in cache_class(factory).settings_taken["mamba_strategy"]:
        pytest.skip(f"SGLang {sglang_version()}'s unified cache is not driven with the extra buffer yet")
    config = CacheConfig(kv_size=96, mamba_size=15, req_size=3, mamba_strategy="extra_buffer", event_loop=event_loop)
    scheduler = SchedulerConfig(chunked_prefill_size=chunk, eos_token_id=99, mamba_track_interval=4)
    return Driver(config, scheduler, factory, protocol="scheduler", set_aside=set_aside(["all"], sglang_version()))


EXTRA_BUFFER_PROGRAM = [
    ("arrive", {"tokens": list(range(1, 14)), "extra_key": None, "max_new_tokens": 6}),
    *[("iterate", {"tokens": [7, 8], "transferred": 0})] * 9,
    ("arrive", {"tokens": list(range(1, 14)) + [50, 51, 52], "extra_key": None, "max_new_tokens": 3}),
    *[("iterate", {"tokens": [9], "transferred": 0})] * 6,
]


def test_with_the_extra_buffer_the_tree_keeps_the_checkpoints_the_forward_pass_wrote(factory):
    """Chunks of 6 tokens checkpoint on the tiny model's 4-token Mamba chunk from each chunk's
    start (4, then 6 + 4); the finished request gives its last decode checkpoint; the second
    request resumes from the deepest checkpoint it shares and donates its own."""
    driver = extra_buffer_driver(factory)
    seen = []
    driver.on_event = driver.caches.on_event = seen.append
    run_program(driver, EXTRA_BUFFER_PROGRAM)
    tree = {tokens: rec.mamba is not None for (_, tokens), rec in driver.model.nodes.items()}
    assert tree[tuple(range(1, 5))] and tree[tuple(range(1, 11))]
    assert tree[tuple(range(1, 14)) + (50,)]  # 10 + 4: the second request's own checkpoint
    assert seen.count("slot donated") >= 2 and "track boundary crossed" in seen
    assert driver.protocol.live_requests() == [] and driver.cut.sizes()[1] == 0


def test_under_the_overlap_loop_a_batch_runs_before_the_last_ones_results_are_processed(factory):
    """`event_loop_overlap` one turn at a time: the result queue holds the launched batch
    between turns, decodes read the token the previous batch sampled from the batch (not yet
    in the request's output), each request holds a ping-pong pair of track slots, and every
    slot comes back at the end."""
    driver = extra_buffer_driver(factory, event_loop="overlap")
    seen = []
    driver.on_event = driver.caches.on_event = seen.append
    runtime = driver.protocol.runtime
    run_program(driver, EXTRA_BUFFER_PROGRAM[:4])
    assert len(runtime.scheduler.result_queue) == 1  # the batch just launched, not yet processed
    assert all(len(runtime.mirror.twins[r.cut.rid].tracks) == 2 for r in driver.protocol.live_requests())
    run_program(driver, EXTRA_BUFFER_PROGRAM[4:])
    assert "track boundary crossed" in seen and "slot donated" in seen
    assert driver.protocol.live_requests() == [] and driver.cut.sizes()[1] == 0


def test_a_checkpoint_recorded_one_token_past_what_the_kernel_wrote_is_caught(factory, monkeypatch):
    """A planted bookkeeping bug in the scheduler (the request records its tracked seqlen one
    past the state the backend writes): the tree keys a state under a path it is not of."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    driver = extra_buffer_driver(factory)
    prepare = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend

    def off_by_one(batch, req):
        entry = prepare(batch, req)
        if entry.track_mask:  # where the era keeps it: req.kv from 0.5.19, the request before
            driver.cut.slots_of(req).mamba_last_track_seqlen += 1
        return entry

    monkeypatch.setattr(ScheduleBatch, "_mamba_radix_cache_v2_req_prepare_for_extend", off_by_one)
    from harness.pairing import Divergence

    # the model takes the checkpoint's length from the stand-in's own record, never SGLang's
    # (the caching call is the era's: checkpoint from 0.5.22, cache_unfinished_req before)
    with pytest.raises(Divergence, match=r"\(req 0, (up_to=6|chunked=True)\): the request's last node after caching differs"):
        run_program(driver, EXTRA_BUFFER_PROGRAM)


def test_a_fuzz_of_the_release_draws_the_extra_buffer_by_default(factory):
    """Where the release's own scheduler is driven with the extra buffer, a fuzz draws it four
    times as often as no_buffer (what SGLang serves by default), the overlap loop in 6 of 10
    programs, pages of 4 or 16 slots in 4 of 10; disaggregated prefill, which falls back to the
    hand-written calls, draws no_buffer alone."""
    from harness.caches import cache_class
    from harness.fuzz.options import FuzzOptions

    from strategies.config import NO_BUFFER

    if "extra_buffer" not in cache_class(factory).settings_taken["mamba_strategy"]:
        pytest.skip(f"SGLang {sglang_version()}'s unified cache is not driven with the extra buffer yet")
    options = FuzzOptions(impl="sglang-python")
    drawn = [dict(s) for s in options.scenario("medium").servings]
    assert len(drawn) == 10 and drawn.count(dict(NO_BUFFER)) == 2
    assert sum(s["event_loop"] == "overlap" for s in drawn) == 6
    assert sorted(s["page_size"] for s in drawn) == [1] * 6 + [4] * 3 + [16]
    assert set(options.scenario("disagg_prefill").servings) == {NO_BUFFER}
    # pinned, a configuration whose programs would fall back to the hand-written calls is left out
    pinned = FuzzOptions(impl="sglang-python", mamba_strategy="extra_buffer", configs=["medium", "disagg_prefill"], device="cpu")
    pinned.check()
    assert (pinned.configs, pinned.left_out) == (["medium"], ["disagg_prefill"])
    assert "runs Mamba strategies ['no_buffer'] only, not 'extra_buffer'" in pinned.left_out_why
