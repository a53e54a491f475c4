"""Failure signatures (`harness.signature`): what makes two failures the same bug, and setting one
aside (`harness.findings.SetAside`)."""

import pytest

from harness.checks import InvariantViolation
from harness.findings import KNOWN_FINDINGS, SetAside, set_aside
from harness.pairing import Divergence, ReleaseRaised, sglang_call
from harness.signature import DIVERGENCE, EXCEPTION, INVARIANT, Signature, normalize, parse_key, signature_of


def test_numbers_are_written_n_and_a_list_of_them_n_dots():
    assert normalize("KV pool: slot(s) [12] freed twice") == normalize("KV pool: slot(s) [3, 4, 5] freed twice")
    assert normalize("KV pool: slot(s) [12] freed twice") == "KV pool: slot(s) [N...] freed twice"
    assert normalize("Mamba slot of dtype torch.int32") == "Mamba slot of dtype torch.int32"
    assert normalize("first line 7\nsecond line") == "first line N"


def test_an_invariant_is_identified_by_its_check_and_what_alone():
    one = signature_of(InvariantViolation("own_storage", "node [1, 2]: ...", "Mamba slot viewing a pool's free list"), "arrive")
    two = signature_of(InvariantViolation("own_storage", "node [7]: ...", "Mamba slot viewing a pool's free list"), "iterate")
    assert one.kind == INVARIANT and one.same_as(two)
    assert one.key == "own_storage | Mamba slot viewing a pool's free list"
    assert one.where == "after arrive" and two.where == "after iterate"


class Calls:
    """A stand-in for `PairedCaches`: what `sglang_call` logs and names."""

    def __init__(self):
        self.calls = []

    @sglang_call("tree_cache.cache_finished_req")
    def finish(self, exc):
        raise exc


def test_an_exception_is_identified_by_the_call_it_left_and_its_message():
    calls = Calls()
    with pytest.raises(TypeError) as raised:
        calls.finish(TypeError("cache_finished_req() got an unexpected keyword argument 'is_insert'"))
    sig = signature_of(raised.value)
    assert sig.kind == EXCEPTION and calls.calls == ["tree_cache.cache_finished_req"]
    assert sig.key == "TypeError | cache_finished_req() got an unexpected keyword argument 'is_insert' | tree_cache.cache_finished_req | -"


def test_a_failure_raised_outside_sglang_and_the_protocols_is_the_harnesss_and_a_disagreement_names_its_call():
    def self_check_during_idle():
        raise ReleaseRaised("ValueError", "memory leak detected! 3 != 4")

    try:
        self_check_during_idle()
    except ReleaseRaised as exc:
        sig = signature_of(exc)
    assert (sig.check, sig.what, sig.where) == ("ValueError", "memory leak detected! N != N", "the harness")
    divergence = Divergence("match_prefix(...)", "matched KV slots", [3], [4])
    divergence.sglang_call = "tree_cache.match_prefix"
    assert signature_of(divergence).kind == DIVERGENCE
    assert signature_of(divergence).key == "model_agreement | matched KV slots | tree_cache.match_prefix | -"


@pytest.mark.parametrize("sig", [
    Signature(INVARIANT, "index_types", "Mamba slot of dtype torch.int32"),
    Signature(EXCEPTION, "SlotError", "KV pool: slot(s) [N...] freed twice", "tree_cache.evict", None),
    Signature(EXCEPTION, "Exception", "sanity_check: Incorrect LRU list", "tree_cache.sanity_check", "sglang.x:LRUList.sanity_check"),
    Signature(DIVERGENCE, "model_agreement", "the request's prefix", "tree_cache.cache_unfinished_req", None),
    # a divergence outside any call the mirror wraps (the stand-in forward pass's) has no where
    Signature(DIVERGENCE, "model_agreement", "the track slot it checkpoints into", "", None),
])
def test_a_key_parses_back_to_the_same_signature(sig):
    assert parse_key(sig.key).key == sig.key
    assert Signature.from_json(sig.to_json()) == sig


@pytest.mark.parametrize("text", ["own_storage", "a | b | c", " | x", "a | b | c | d | e"])
def test_a_key_that_does_not_parse_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="not a failure signature"):
        parse_key(text)


def test_a_signature_set_aside_is_passed_over_by_a_tolerable_check_and_covers_its_failures():
    aside = set_aside(["own_storage | Mamba slot viewing a pool's free list", "SlotError | x | tree_cache.evict | -"], "0.1.0")
    assert aside.tolerates("own_storage", "Mamba slot viewing a pool's free list")
    assert not aside.tolerates("own_storage", "KV slots viewing a pool's free list")
    assert aside.covers(parse_key("SlotError | x | tree_cache.evict | -"))
    assert not aside.covers(parse_key("SlotError | x | tree_cache.evict_mamba | -"))
    # a check that cannot go on past a failure only ends the program: it never tolerates
    leaked = SetAside(signatures=[Signature(INVARIANT, "pool_conservation", "KV slot leaked")])
    assert not leaked.tolerates("pool_conservation", "KV slot leaked")
    assert leaked.covers(Signature(INVARIANT, "pool_conservation", "KV slot leaked"))


def test_a_known_finding_matches_the_signature_of_its_failure():
    fork = KNOWN_FINDINGS["mamba-fork-views-free-list"]
    assert fork.matches(Signature(INVARIANT, "own_storage", "Mamba slot viewing a pool's free list"))
    assert not fork.matches(Signature(INVARIANT, "own_storage", "KV slots viewing a pool's free list"))
    assert fork.meets("0.5.24.dev3+g1234abc")  # a development version: the newest release's findings
    retract = KNOWN_FINDINGS["retract-passes-is-insert"]
    assert retract.matches(parse_key("TypeError | cache_finished_req() got an unexpected keyword argument 'is_insert' | tree_cache.cache_finished_req | -"))
    assert not retract.precise  # set aside by the requests it lets arrive: judged by its trace
