"""The reference model's extra buffer (`--mamba-strategy extra_buffer`): each request holds track
slots beside its running state, the forward pass writes a checkpoint into one at each track
boundary, and the tree takes a tracked state (never the running one) under a key cut to its
length. What every slot becomes is asserted call by call, as the contract states it."""

import pytest

from reference import ROOT, SGLANG_UNIFIED, ModelReq, ReferenceCache
from strategies.config import serving


def model(tracking_slots: int = 1) -> ReferenceCache:
    return ReferenceCache(kv_size=32, mamba_size=8, req_size=4, rules=SGLANG_UNIFIED, tracking_slots=tracking_slots)


def running(m: ReferenceCache, rid: int, tokens) -> ModelReq:
    """A request admitted with its row written for all of `tokens` (prefilled, no prefix)."""
    req = ModelReq(rid=rid, origin=tuple(tokens))
    m.req_alloc([req])
    req.row = dict(enumerate(m.kv_alloc(len(tokens))))
    m.inc_lock(ROOT)
    return req


def owned_mamba(m: ReferenceCache, reqs) -> list:
    tree = [r.mamba for r in m.nodes.values() if r.mamba is not None]
    held = [s for r in reqs for s in ([r.mamba_slot] if r.mamba_slot is not None else []) + r.tracks]
    return sorted(m.mamba_free + tree + held)


def test_a_request_gets_its_running_slot_then_its_track_slots():
    m = model(tracking_slots=2)
    req = running(m, 0, [1, 2, 3])
    assert (req.mamba_slot, req.tracks, req.track_lens) == (1, [2, 3], [None, None])
    assert m.mamba_free == [4, 5, 6, 7, 8]


def test_no_tracked_state_caches_nothing_of_a_running_request():
    m = model()
    req = running(m, 0, [1, 2, 3, 4, 5, 6])
    req.fill = req.origin
    m.cache_unfinished_req(req)
    assert m.nodes == {} and req.prefix == () and req.last == ROOT


def test_a_running_request_donates_its_tracked_state_under_a_key_cut_to_it():
    m = model()
    req = running(m, 0, [1, 2, 3, 4, 5, 6])
    track = req.tracks[0]
    m.record_track(req, track, 4)
    req.fill = req.origin
    m.cache_unfinished_req(req)
    node = (None, (1, 2, 3, 4))
    assert list(m.nodes) == [node] and m.nodes[node].mamba == track
    assert req.prefix == tuple(req.row[i] for i in range(4)) and req.last == node
    # a fresh slot takes the donated one's place, and the tracked lengths are forgotten
    assert req.tracks == [3] and req.track_lens == [None]
    assert owned_mamba(m, [req]) == list(m.mamba_slots)
    assert "slot donated" in m.events


def test_a_finished_request_caches_up_to_its_tracked_state_and_frees_the_rest():
    m = model()
    req = running(m, 0, [1, 2, 3, 4, 5, 6])
    running_slot, track = req.mamba_slot, req.tracks[0]
    m.record_track(req, track, 4)
    kv = [req.row[i] for i in range(6)]
    m.cache_finished_req(req, length=6)
    assert m.nodes[(None, (1, 2, 3, 4))].mamba == track
    assert m.kv_free[-2:] == kv[4:]  # the KV past the key goes back
    assert m.mamba_free[-1] == running_slot and track not in m.mamba_free
    assert owned_mamba(m, []) == list(m.mamba_slots)
    assert req.req_slot is None and req.mamba_slot is None and req.tracks == []


def test_a_finished_request_with_no_tracked_state_gives_everything_back():
    m = model()
    req = running(m, 0, [1, 2, 3])
    m.cache_finished_req(req, length=3)
    assert m.nodes == {}
    assert sorted(m.mamba_free) == list(m.mamba_slots) and sorted(m.kv_free) == list(m.kv_slots)


def test_a_state_already_in_the_tree_frees_the_request_s_copy():
    m = model()
    first = running(m, 0, [1, 2, 3, 4])
    m.record_track(first, first.tracks[0], 4)
    m.cache_finished_req(first, length=4)
    second = running(m, 1, [1, 2, 3, 4])
    track = second.tracks[0]
    m.record_track(second, track, 4)
    m.cache_finished_req(second, length=4)
    assert len(m.nodes) == 1 and track in m.mamba_free


def test_an_overshooting_last_state_falls_back_to_the_other_ping_pong_slot():
    m = model(tracking_slots=2)
    req = running(m, 0, [1, 2, 3, 4, 5, 6, 7, 8])
    m.record_track(req, req.tracks[0], 4)
    m.record_track(req, req.tracks[1], 8)
    req.output = []
    m.cache_finished_req(req, length=6)  # the state of 8 tokens cannot name a key of 6
    assert list(m.nodes) == [(None, (1, 2, 3, 4))]


def test_a_track_slot_the_request_does_not_hold_is_refused():
    m = model()
    req = running(m, 0, [1, 2, 3])
    with pytest.raises(ValueError, match="holds track slots"):
        m.record_track(req, 7, 2)


def test_the_configuration_names_its_strategy_and_its_track_slots():
    from strategies.config import CacheConfig, SchedulerConfig

    assert CacheConfig(kv_size=8, mamba_size=4, req_size=1).tracking_slots == 0
    assert CacheConfig(kv_size=8, mamba_size=4, req_size=1, mamba_strategy="extra_buffer").tracking_slots == 1
    assert CacheConfig(kv_size=8, mamba_size=4, req_size=1, mamba_strategy="extra_buffer", event_loop="overlap").tracking_slots == 2
    with pytest.raises(ValueError, match="SGLang serves no mamba_strategy 'no_buffer', event_loop 'overlap', page_size 1 together"):
        CacheConfig(kv_size=8, mamba_size=4, req_size=1, event_loop="overlap")
    with pytest.raises(ValueError, match="SGLang serves no mamba_strategy 'no_buffer', event_loop 'normal', page_size 4 together"):
        CacheConfig(kv_size=8, mamba_size=4, req_size=1, page_size=4)
    with pytest.raises(ValueError, match="kv_size must be whole pages of 4 slots, got 10"):
        CacheConfig(kv_size=10, mamba_size=4, req_size=1, mamba_strategy="extra_buffer", page_size=4)
    with pytest.raises(ValueError, match=r"page_size must be one of \(1, 4, 16, 64\), got 8"):
        CacheConfig(kv_size=16, mamba_size=4, req_size=1, mamba_strategy="extra_buffer", page_size=8)
    with pytest.raises(ValueError, match="mamba_strategy must be one of .*, got 'lazy'"):
        CacheConfig(kv_size=8, mamba_size=4, req_size=1, mamba_strategy="lazy")
    with pytest.raises(ValueError, match="mamba_track_interval must be a positive int, got 0"):
        SchedulerConfig(mamba_track_interval=0)


def test_extra_buffer_pools_hold_the_track_slots_of_every_request():
    """As 0.5.23's model runner sizes them: 3 + 1 Mamba slots per request slot."""
    import random
    from dataclasses import replace

    from strategies.scenarios import SCENARIOS

    rng = random.Random(7)
    for scenario in SCENARIOS.values():
        for _ in range(20):
            config = replace(scenario, servings=(serving("extra_buffer", "normal"),)).config(rng.randint)
            assert config.mamba_strategy == "extra_buffer" and config.mamba_size >= 4 * config.req_size
            config = replace(scenario, servings=(serving("extra_buffer", "overlap"),)).config(rng.randint)
            assert config.tracking_slots == 2 and config.mamba_size >= 5 * config.req_size


def test_a_release_may_free_the_kv_past_the_key_before_the_insert():
    """`finishing_frees_past_key_first` (unified 0.5.16): the same slots freed, the tail first."""
    from dataclasses import replace

    orders = []
    for first in (False, True):
        m = ReferenceCache(kv_size=32, mamba_size=8, req_size=4, tracking_slots=1,
                           rules=replace(SGLANG_UNIFIED, finishing_frees_past_key_first=first))
        first_req = running(m, 0, [1, 2, 3, 4])
        m.record_track(first_req, first_req.tracks[0], 4)
        m.cache_finished_req(first_req, length=4)
        req = running(m, 1, [1, 2, 3, 4, 5, 6])  # its first four tokens duplicate the tree's
        m.record_track(req, req.tracks[0], 4)
        kv = [req.row[i] for i in range(6)]
        m.cache_finished_req(req, length=6)
        orders.append(m.kv_free[-6:])
    after, before = orders
    assert after == kv[:4] + kv[4:] and before == kv[4:] + kv[:4]


def test_a_checkpoint_into_a_slot_its_request_released_is_no_ones():
    """The overlap loop processes a batch's results after it launches the next: a request may
    have released its track slots (finished, aborted, retracted) by the time the scheduler
    hears of a checkpoint the next batch wrote there. A slot it never held is still refused."""
    model = ReferenceCache(kv_size=16, mamba_size=8, req_size=2, rules=SGLANG_UNIFIED, tracking_slots=2)
    req = ModelReq(rid=0, origin=(1, 2, 3))
    model.req_alloc([req])
    released = list(req.tracks)
    req.drop_tracks()
    model.record_track(req, released[1], 4)
    assert "checkpoint after release" in model.events and req.track_lens == []
    with pytest.raises(ValueError, match="holds track slots"):
        model.record_track(req, 7, 4)
