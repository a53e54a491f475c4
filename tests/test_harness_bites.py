"""The harness catches planted bugs, and Hypothesis prints the shrunk failing program."""

import functools

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from broken_impls import BROKEN
from harness.caches import ImplCache
from harness.driver import Driver, paused_gc
from harness.engines.hypothesis_engine import machine_for
from strategies import SCENARIOS
from strategies.config import CacheConfig


@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_planted_bug_is_caught_with_a_printed_program(bug, device, tmp_path):
    cache = functools.partial(ImplCache, cache_class=BROKEN[bug])
    machine = machine_for(SCENARIOS["medium"], cache, device=str(device), trace_dir=str(tmp_path))
    budget = settings(settings(), max_examples=max(settings().max_examples, 200), report_multiple_bugs=False)
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=budget)
    program = "\n".join(getattr(caught.value, "__notes__", []))
    assert "state = " in program and "state.step(" in program, program
    assert "Draw 1 (config)" in program and "(scheduler)" in program, program
    assert len(list(tmp_path.glob("*.json"))) == 1, "the shrunk failure was not saved as a trace"


def _three_node_driver(device):
    driver = Driver(CacheConfig(kv_size=32, mamba_size=8, req_size=2, max_context_len=32, device=str(device)))
    for tokens in ([1, 2, 3], [1, 2, 4], [5]):
        driver.apply("insert", tokens=tokens, extra_key=None)
    driver.check()
    return driver


def _break_back_link(lru):
    first = lru._head.next
    first.next.prev = lru._head


def _break_tick_order(lru):
    first = lru._head.next
    first.next.tick = first.tick


def _miscount(lru):
    lru._size += 1


@pytest.mark.parametrize("corrupt", [_break_back_link, _break_tick_order, _miscount])
def test_lru_links_are_walked_by_the_harness_not_asked_of_the_list(corrupt, device, monkeypatch):
    from harness.checks import InvariantViolation
    from impl.lru_list import LRUList

    with paused_gc():
        driver = _three_node_driver(device)
        monkeypatch.setattr(LRUList, "links_consistent", lambda self: True)  # a list that vouches for itself
        corrupt(driver.cut.cache.full_lru_list)
        with pytest.raises(InvariantViolation) as caught:
            driver.check()
    assert caught.value.check == "lru_lists"
    assert "full LRU list prev/next links or tick order are inconsistent" in str(caught.value)
