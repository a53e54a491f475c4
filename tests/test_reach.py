"""The state machine reaches every hard path within a fixed budget.

Runs several configurations for a fixed number of programs and fails naming every reach label
(`harness.engines.hypothesis_engine.REACH_LABELS`) that never occurred. The contract scheduler
drives `impl`; the paths only SGLang 0.5.4's scheduler takes (a waiting request that keeps its
copy-on-write slot, then is re-matched or aborted) are reached by driving `impl` with that
release's calls, which `impl` must accept. The extra buffer's paths are reached under the
installed SGLang release's own scheduler (skipped without one that drives it).
"""

import random
from collections import Counter
from dataclasses import replace

import pytest

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.caches import ImplCache
from harness.engines.hypothesis_engine import EXTRA_BUFFER_LABELS, PAGED_LABELS, RELEASE_0_5_4_LABELS, REACH_LABELS, machine_for
from harness.engines.random_engine import ProgramFailed, random_program
from strategies import SCENARIOS
from strategies.config import serving

# derandomized: the same programs on every run, here as in CI
BUDGET = settings(settings(), max_examples=60, stateful_step_count=50, database=None, derandomize=True)
PROGRAMS = 60  # per configuration, for the random programs


def reached(names, trace_dir) -> Counter:
    """Labels seen running the configurations `names` under the contract."""
    seen = Counter()
    for name in names:
        machine = machine_for(SCENARIOS[name], event_sink=lambda label: seen.update([label]), trace_dir=str(trace_dir))
        run_state_machine_as_test(machine, settings=BUDGET)
    return seen


def test_every_reach_label_occurs_within_the_budget(tmp_path):
    seen = reached(("tiny", "chunked", "lock_heavy", "medium", "decode_pressure", "disagg_prefill"), tmp_path)
    missing = [label for label in REACH_LABELS if seen[label] == 0]
    assert not missing, f"never reached: {missing}; seen: {dict(seen)}"


def test_impl_takes_every_call_of_sglang_0_5_4s_scheduler(tmp_path):
    """Under 0.5.4's own scheduler `impl` reaches the paths only that scheduler takes. A program
    may end in one of that scheduler's known findings (a leak, its idle check, a misuse `impl`
    refuses as 0.5.4's own cache does), never in `impl` refusing a call's arguments (TypeError).
    Seeded random programs, each failure left unshrunk: every program runs, whatever the one
    before it ended in."""
    seen = Counter()
    rng = random.Random(54)
    for name in ("tiny", "medium", "chunked"):
        for _ in range(PROGRAMS):
            try:
                random_program(SCENARIOS[name], ImplCache, rng, BUDGET.stateful_step_count, "cpu", str(tmp_path),
                               lambda label: seen.update([label]), protocol="sglang-0.5.4", shrink=False)
            except ProgramFailed as failed:
                assert failed.check != "TypeError", failed
    missing = [label for label in RELEASE_0_5_4_LABELS if seen[label] == 0]
    assert not missing, f"never reached: {missing}; seen: {dict(seen)}"


def _inside_the_scheduler(cache: str, setting: str, value):
    """The factory of `cache` (SGLang's unified Python cache, or impl's tree inside the installed
    release's scheduler) and the known findings set aside for it, or a skip naming why the
    installed release does not run it with `setting` at `value`."""
    from harness.caches import ImplCache, cache_class, cache_factory, cache_release
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version
    from harness.findings import set_aside
    from harness.protocols import RealSchedulerProtocol

    reason = sglang_unavailable()
    if reason:
        pytest.skip(reason)
    factory = cache_factory(cache)
    refused = RealSchedulerProtocol.refusal(factory) if issubclass(cache_class(factory), ImplCache) else ""
    if refused:
        pytest.skip(refused)
    if value not in RealSchedulerProtocol.cache_settings_taken(factory).get(setting, (value,)):
        pytest.skip(f"{cache} under SGLang {sglang_version()}'s scheduler is not built with {setting} {value!r}")
    return factory, set_aside(["all"], cache_release(factory), sglang_version())


@pytest.mark.sglang
@pytest.mark.parametrize("cache", ["sglang-python", "impl"])
def test_the_extra_buffer_s_paths_occur_under_the_release_s_own_scheduler(tmp_path, cache):
    """Checkpoints at track boundaries, slots donated by running and finished requests, a
    request finishing before any checkpoint, a request released without caching (aborted or
    retracted): each reached by seeded random programs with the extra buffer, for SGLang's
    cache and for impl's tree inside the scheduler, the known findings set aside."""
    factory, aside = _inside_the_scheduler(cache, "mamba_strategy", "extra_buffer")
    seen = Counter()
    rng = random.Random(32)
    for name in ("chunked", "decode_pressure", "medium"):
        scenario = replace(SCENARIOS[name], servings=(serving("extra_buffer", "normal"), serving("extra_buffer", "overlap")))
        for _ in range(PROGRAMS // 3):
            random_program(scenario, factory, rng, BUDGET.stateful_step_count, "cpu", str(tmp_path),
                           lambda label: seen.update([label]), protocol="scheduler", set_aside=aside, shrink=False)
    missing = [label for label in EXTRA_BUFFER_LABELS if seen[label] == 0]
    assert not missing, f"never reached: {missing}; seen: {dict(seen)}"


@pytest.mark.sglang
@pytest.mark.parametrize("cache", ["sglang-python", "impl"])
def test_paged_kv_s_paths_occur_under_the_release_s_own_scheduler(tmp_path, cache):
    """Pages of 4 and 64 slots: a split at a page boundary, a prompt shorter than a page, a
    decode starting a page; each reached by seeded random programs, for SGLang's cache and for
    impl's tree inside the scheduler, the known findings set aside."""
    factory, aside = _inside_the_scheduler(cache, "page_size", 4)
    seen = Counter()
    rng = random.Random(64)
    pages = (serving("extra_buffer", "overlap", 4), serving("extra_buffer", "normal", 4), serving("extra_buffer", "normal", 64))
    for name in ("chunked", "medium", "large"):
        for _ in range(PROGRAMS // 3):
            random_program(replace(SCENARIOS[name], servings=pages), factory, rng, BUDGET.stateful_step_count, "cpu",
                           str(tmp_path), lambda label: seen.update([label]), protocol="scheduler", set_aside=aside, shrink=False)
    missing = [label for label in PAGED_LABELS if seen[label] == 0]
    assert not missing, f"never reached: {missing}; seen: {dict(seen)}"
