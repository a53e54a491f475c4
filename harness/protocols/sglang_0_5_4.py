"""SGLang 0.5.4's scheduler, as far as it touches the tree cache and the pools.

Transcribed from the 0.5.4 wheel (`sglang/srt/...`); each method names the function it stands
for. `docs/scheduler-protocol.md` maps every call site to the method here. What is left out
touches neither the cache nor the pools (tokenizer, sampling, streaming, metrics, grammar,
LoRA, hierarchical cache, speculative decoding, pipeline parallelism, overlap scheduling) and is
listed there with the reason.

The operations:
  arrive(tokens, extra_key, max_new_tokens)   a request reaches the scheduler
                                              (`Scheduler.handle_generate_request`)
  iterate(tokens, transferred)                one turn of the event loop (`event_loop_normal`,
                                              or `event_loop_normal_disagg_prefill`): `tokens`
                                              are what the forward pass samples, one per request
                                              of the batch (the eos token ends a request);
                                              `transferred` how many in-flight KV transfers end
  abort(rid)                                  `Scheduler.abort_request` for one request
  flush()                                     `Scheduler.flush_cache`
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from harness.checks.violation import never
from harness.operations import sampled_token
from harness.pairing import ReleaseRaised, Request
from harness.protocols.base import SchedulerProtocol

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.CLIP_MAX_NEW_TOKENS (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)
INIT_NEW_TOKEN_RATIO = 0.7  # envs.SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # envs.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # envs.SGLANG_RETRACT_DECODE_STEPS
FORWARD_SECONDS = 0.01  # how long the stand-in forward pass lets the clock run

CONTINUE, NO_TOKEN, OTHER = "continue", "no token", "other"  # schedule_policy.AddReqResult


class PrefillAdder:
    """`schedule_policy.PrefillAdder` for a Mamba hybrid model (page size 1, no host cache):
    which waiting requests fit the token budget, locking each admitted request's last node.
    Its arithmetic reads the KV pool's available size and the tree's evictable size, as 0.5.4's
    does."""

    def __init__(self, sched: "Sglang054Scheduler"):
        self.sched = sched
        self.caches = sched.caches
        config = sched.scheduler
        self.rem_input_tokens = config.max_prefill_tokens
        self.rem_chunk_tokens = config.chunked_prefill_size
        self.rem_total_token_offset = sum(self._running_offset(r) for r in sched.running)
        self.cur_rem_token_offset = 0
        self.can_run: List[Request] = []
        self.new_chunked: Optional[Request] = None

    def _running_offset(self, req: Request) -> float:
        """`_get_running_request_total_token_offset`."""
        return min(req.max_new_tokens - len(req.output), CLIP_MAX_NEW_TOKENS) * self.sched.new_token_ratio

    def _available_and_evictable(self) -> int:
        return self.caches.kv_available() + self.caches.sizes()[0]

    @property
    def rem_total_tokens(self) -> float:
        return self._available_and_evictable() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._available_and_evictable() - self.cur_rem_token_offset

    def budget_state(self) -> str:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return NO_TOKEN
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return OTHER
        return CONTINUE

    def _update_prefill_budget(self, extend_input_len: int, max_new_tokens: int) -> None:
        self.rem_total_token_offset += extend_input_len + max_new_tokens
        self.cur_rem_token_offset += extend_input_len
        self.rem_input_tokens -= extend_input_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len

    def add_chunked_req(self, req: Request) -> Optional[Request]:
        """The request being chunked takes its next chunk (its lock is held since its last one),
        as long as the token budget allows: with the budget spent the chunk is empty, or
        negative (its fill_ids are cut back below its prefix)."""
        rem_tokens = self.chunk_budget()
        truncated = req.extend_len > rem_tokens
        req.extend_len = min(req.extend_len, rem_tokens)
        self.caches.set_fill(req, req.prefix_len + req.extend_len)
        self.can_run.append(req)
        self._update_prefill_budget(req.extend_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def chunk_budget(self) -> int:
        return min(self.rem_chunk_tokens, int(self.rem_total_tokens))

    def add_one_req(self, req: Request) -> str:
        total_tokens = req.extend_len + min(max(req.max_new_tokens - len(req.output), 0), CLIP_MAX_NEW_TOKENS)
        if total_tokens >= self.rem_total_tokens:
            return NO_TOKEN
        if req.extend_len >= self.rem_input_tokens and self.can_run:
            return OTHER
        # _lock_node: the last node is locked while the budget is read again
        self.caches.inc_lock_ref(req)
        try:
            if total_tokens >= self.rem_total_tokens:
                return NO_TOKEN
            if req.extend_len >= self.rem_input_tokens and self.can_run:
                return OTHER
            if self.rem_chunk_tokens is None or req.extend_len <= self.rem_chunk_tokens:
                self.can_run.append(req)
                self.caches.inc_lock_ref(req)
                self._update_prefill_budget(req.extend_len, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
            else:
                trunc_len = self.rem_chunk_tokens
                if trunc_len <= 0:
                    return OTHER
                req.extend_len = trunc_len
                self.caches.set_fill(req, req.prefix_len + trunc_len)
                self.can_run.append(req)
                self.new_chunked = req
                self.caches.inc_lock_ref(req)
                self._update_prefill_budget(trunc_len, 0)
        finally:
            self.caches.dec_lock_ref(req)
        return self.budget_state()


class Sglang054Scheduler(SchedulerProtocol):
    """SGLang 0.5.4's `Scheduler` (normal and disaggregated-prefill event loops)."""

    name = "sglang-0.5.4"
    operations = ("arrive", "iterate", "abort", "flush")
    adder_class = PrefillAdder

    def __init__(self, caches, config, scheduler, on_event, tolerate=never):
        super().__init__(caches, config, scheduler, on_event, tolerate)
        self.waiting: List[Request] = []  # waiting_queue
        self.bootstrapping: List[Request] = []  # disagg_prefill_bootstrap_queue
        self.running: List[Request] = []  # running_batch.reqs
        self.chunked: Optional[Request] = None  # chunked_req
        self.inflight: List[Request] = []  # disagg_prefill_inflight_queue
        self.last_batch: Optional[List[Request]] = None  # last_batch, when it was a prefill batch
        self.cur_batch_is_running = True  # whether cur_batch is the running batch (or None)
        self.batch_is_full = False  # running_batch.batch_is_full
        self.max_running = scheduler.max_running_requests or config.req_size
        self.max_req_len = min(config.max_context_len - 1, config.kv_size - 1)  # TpModelWorker.max_req_len
        self.max_req_input_len = self.max_req_len - 5
        # Scheduler.__init__: the new-token ratio the budget reserves for running requests
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * scheduler.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio

    @property
    def disaggregated(self) -> bool:
        return self.scheduler.disaggregation_mode == "prefill"

    def referenced_requests(self) -> List[Request]:
        """Every request the scheduler's queues and batches still refer to (a finished one stays
        in the running batch until the next turn filters it out)."""
        held = self.bootstrapping + self.waiting + ([self.chunked] if self.chunked else []) + self.running + self.inflight
        return held + [r for r in self.last_batch or () if r not in held]

    # ----- arrive -----------------------------------------------------------------------------

    def arrive(self, tokens: Sequence[int], extra_key: Optional[str], max_new_tokens: int) -> None:
        """`handle_generate_request`: `init_req_max_new_tokens`, then `validate_input_length`
        (an input too long for the pool is aborted: `set_finish_with_abort` leaves one token to
        prefill), then `_add_request_to_queue`."""
        max_new = min(max_new_tokens, self.max_req_len - len(tokens) - 1)
        too_long = len(tokens) >= self.max_req_input_len
        req = self.caches.new_request(self.next_rid(), [0] if too_long else tokens, extra_key, max_new)
        if too_long:
            req.finished = "abort"
            self.on_event("input too long: aborted, one token prefilled")
        (self.bootstrapping if self.disaggregated else self.waiting).append(req)

    # ----- abort ------------------------------------------------------------------------------

    def abort(self, rid: int) -> None:
        """`abort_request`: a waiting request is popped from the queue ("abort method 1"); a
        running one is marked `to_abort` and finishes at its next result ("method 3")."""
        req = self.request(rid, f"abort(rid={rid})")
        if req in self.waiting:
            self.waiting.remove(req)
            self.abort_waiting(req)
            self.on_event("abort of a waiting request")
        elif req in self.bootstrapping:
            self.bootstrapping.remove(req)
            self.on_event("abort of a bootstrapping request")
        else:
            # running_batch.reqs, plus cur_batch.reqs when the last batch was a prefill batch
            in_cur_batch = req in self.running or (not self.cur_batch_is_running and req in (self.last_batch or ()))
            if req in self.inflight or in_cur_batch:
                req.to_abort = True
                self.on_event(f"abort of a request in {self.phase_of(req)}")

    def abort_waiting(self, req: Request) -> None:
        """A popped waiting request is sent its abort; nothing it holds is released."""
        if self.caches.cut.mamba_slot_of(req.cut) is not None:
            self.on_event("abort of a waiting request holding a Mamba slot")

    def phase_of(self, req: Request) -> str:
        if req is self.chunked:
            return "chunked prefill"
        if req in self.inflight:
            return "KV transfer"
        return "decode" if req.output else "prefill"

    # ----- flush ------------------------------------------------------------------------------

    def flush(self) -> None:
        """`flush_cache`: only with an empty waiting queue and running batch; then the tree is
        reset and both pools cleared."""
        if not self.flushable():
            return
        self.on_event("cache flushed")
        self.last_batch = None
        self.cur_batch_is_running = True
        self.caches.reset()
        self.caches.req_pool_clear()
        self.caches.kv_clear()

    def flushable(self) -> bool:
        return not self.waiting and not self.running

    # ----- one turn of the event loop ----------------------------------------------------------

    def iterate(self, tokens: Sequence[int], transferred: int) -> None:
        if self.disaggregated:
            self._iterate_disagg_prefill(tokens, transferred)
            return
        # event_loop_normal
        batch = self._get_next_batch_to_run()
        if batch is None:
            self.self_check_during_idle()
            self.last_batch = None
            self.cur_batch_is_running = True
            return
        decoding = batch is self.running
        self.cur_batch_is_running = decoding
        self._run_batch(batch, decoding)
        if decoding:
            self._process_batch_result_decode(batch, tokens)
            self.last_batch = None
        else:
            self._process_batch_result_prefill(batch, tokens)
            self.last_batch = batch

    def _iterate_disagg_prefill(self, tokens: Sequence[int], transferred: int) -> None:
        """`event_loop_normal_disagg_prefill`."""
        self.waiting.extend(self.bootstrapping)  # pop_bootstrapped: the handshake is immediate here
        self.bootstrapping = []
        self._process_prefill_chunk()
        batch = self._get_new_batch_prefill()
        self.cur_batch_is_running = batch is None
        if batch is not None:
            self._run_batch(batch, decoding=False)
            self._process_batch_result_disagg_prefill(batch, tokens)
        if self.inflight:
            self._process_disagg_prefill_inflight_queue(transferred)
        if batch is None and not self.inflight:
            self.self_check_during_idle()
        self.last_batch = batch
        self.batch_is_full = False

    def _get_next_batch_to_run(self) -> Optional[List[Request]]:
        """`get_next_batch_to_run`: the request being chunked goes into the tree and gives back
        its request slot; the last prefill batch joins the running batch; a new prefill batch
        if there is one, else the running batch decodes."""
        excluded = []
        if self.chunked is not None:
            excluded.append(self.chunked)
            self.caches.cache_unfinished_req(self.chunked, chunked=True)
            self.free_chunked_slot(self.chunked)
        if self.last_batch is not None:
            last_bs = len(self.last_batch)
            kept = [r for r in self.last_batch if r.finished is None and r not in excluded]
            if len(kept) < last_bs:
                self.batch_is_full = False
            self.running = self.running + kept
            self.last_batch = None
        batch = self._get_new_batch_prefill()
        if batch is not None:
            return batch
        if self.running:
            self._update_running_batch()
            return self.running or None
        return None

    def free_chunked_slot(self, req: Request) -> None:
        """The chunked request "keeps its rid but will get a new req_pool_idx": for a model with
        Mamba layers, without freeing its Mamba slot."""
        self.caches.req_free(req, free_mamba_cache=False)
        self.on_event("chunked request's slot given back between chunks")

    # ----- prefill ----------------------------------------------------------------------------

    def _get_new_batch_prefill(self) -> Optional[List[Request]]:
        """`get_new_batch_prefill`."""
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        running_bs = len(self.running)
        if self.max_running - running_bs <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        self._calc_priority()
        adder = self.adder_class(self)
        if self.chunked is not None:
            self._init_next_round_input(self.chunked, match=False)
            self.chunked = adder.add_chunked_req(self.chunked)
        for req in list(self.waiting):
            if len(adder.can_run) >= self.max_running - len(self.running):
                self.batch_is_full = True
            if self.disaggregated and len(adder.can_run) >= self.caches.req_available():
                self.batch_is_full = True
            if self.batch_is_full:
                break
            self._init_next_round_input(req, match=True)
            result = adder.add_one_req(req)
            if result != CONTINUE:
                if result == NO_TOKEN:
                    self.batch_is_full = True
                if req not in adder.can_run:
                    self.refused(req)
                break
        if not adder.can_run:
            return None
        self.waiting = [r for r in self.waiting if r not in adder.can_run]
        if adder.new_chunked is not None:
            self.chunked = adder.new_chunked
        if self.chunked is not None:
            self.chunked.is_chunked += 1
            self.on_event("chunked prefill step")
        self._prepare_for_extend(adder.can_run)
        return adder.can_run

    def refused(self, req: Request) -> None:
        """A request the adder turned down stays waiting with what its match gave it, the
        Mamba slot its copy-on-write filled included."""
        self.on_event("a matched request refused by the prefill budget")

    def _calc_priority(self) -> None:
        """`SchedulePolicy.calc_priority`: under `lpm`, every waiting request's whole sequence
        is matched (no copy-on-write) and the queue sorted by the matched length."""
        if self.scheduler.schedule_policy != "lpm" or len(self.waiting) > 128:
            return
        for req in self.waiting:
            self.caches.match_prefix(req, req.tokens(), rid=req.rid)
        self.waiting.sort(key=lambda r: -r.prefix_len)

    def _init_next_round_input(self, req: Request, match: bool) -> None:
        """`Req.init_next_round_input`: fill_ids are the input and output so far; with the tree
        cache given, everything but the last token is matched, copying the matched state into
        the request's Mamba slot."""
        fill = len(req.tokens())
        self.caches.set_fill(req, fill)
        if match:
            self.caches.match_prefix(req, req.tokens()[: max(fill - 1, 0)], req=req, cow_mamba=True)
        req.extend_len = fill - req.prefix_len

    def _prepare_for_extend(self, batch: List[Request]) -> None:
        """`ScheduleBatch.prepare_for_extend` -> `alloc_for_extend`: request slots
        (`alloc_req_slots`), KV slots for every new token (`alloc_token_slots`), both written
        to the rows (`write_cache_indices`)."""
        self._ensure_mamba_slots(batch)
        if self.caches.req_alloc(batch) is None:
            raise ReleaseRaised("RuntimeError", "alloc_req_slots runs out of memory")
        slots = self._alloc_token_slots(sum(r.extend_len for r in batch))
        start = 0
        for req in batch:
            self.caches.write_row(req, 0, self.caches.cut.prefix_of(req.cut))
            self.caches.write_row(req, req.prefix_len, slots[start : start + req.extend_len])
            start += req.extend_len

    def _ensure_mamba_slots(self, batch: List[Request]) -> None:
        """`alloc_for_extend` (0.5.4): a Mamba slot for every request of the batch, evicting
        states when the pool is short."""
        self._evict_mamba_shortfall(len(batch))

    def _evict_mamba_shortfall(self, needed: int) -> None:
        """Evict as many Mamba states as the pool is short of `needed` free slots."""
        available = self.caches.mamba_available()
        if available < needed:
            self.caches.evict_mamba(needed - available)
            self.on_event("Mamba allocation short: evicted, then retried")

    def _alloc_token_slots(self, n: int) -> List[int]:
        """`alloc_token_slots`: evict first when the pool is short (`evict_from_tree_cache`);
        out of memory is an error."""
        self._evict_from_tree_cache(n)
        slots = self.caches.kv_alloc(n)
        if slots is None:
            raise ReleaseRaised("RuntimeError", f"Out of memory. Try to lower your batch size. Try to allocate {n} tokens.")
        return slots

    def _evict_from_tree_cache(self, n: int) -> None:
        if self.caches.kv_available() < n:
            self.caches.evict(n)
            self.on_event("KV allocation short: evicted, then retried")

    def _run_batch(self, batch: List[Request], decoding: bool) -> None:
        """The forward pass: each request computes its new tokens' KV and its new state."""
        self.caches.cut.advance_clock(FORWARD_SECONDS)
        for req in batch:
            if decoding:
                self.caches.forward(req, req.kv_len - 1, req.kv_len)
            else:
                self.caches.forward(req, req.prefix_len, req.fill_len)
                req.kv_len = req.fill_len

    def _process_batch_result_prefill(self, batch: List[Request], tokens: Sequence[int]) -> None:
        """`process_batch_result_prefill`: a request done with its input takes its first output
        token, then finishes (`cache_finished_req`) or goes into the tree for others to match
        (`cache_unfinished_req`); the request being chunked does nothing until the next turn."""
        for i, req in enumerate(batch):
            if req.is_chunked > 0:
                req.is_chunked -= 1
                continue
            self.caches.append_output(req, sampled_token(tokens, i))
            self._check_finished(req)
            if req.finished is not None:
                self.on_event("finish at the end of prefill")
                self.caches.cache_finished_req(req)
            else:
                self.caches.cache_unfinished_req(req)

    def _check_finished(self, req: Request) -> None:
        """`Req.check_finished`: an abort, the length limit, or the eos token."""
        if req.finished is not None:
            return
        if req.to_abort:
            req.finished = "abort"
        elif len(req.output) >= req.max_new_tokens:
            req.finished = "length"
        elif req.output[-1] == self.scheduler.eos_token_id:
            req.finished = "stop"

    # ----- decode -----------------------------------------------------------------------------

    def _update_running_batch(self) -> None:
        """`update_running_batch`: finished requests leave; decode needs one KV slot per request
        (`check_decode_mem`, evicting first), else requests are retracted (`retract_decode`)."""
        initial_bs = len(self.running)
        self.running = [r for r in self.running if r.finished is None]
        if not self.running:
            self.batch_is_full = False
            return
        if not self._check_decode_mem(self.running):
            self._retract_decode()
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        if len(self.running) < initial_bs:
            self.batch_is_full = False
        # prepare_for_decode -> alloc_for_decode: one KV slot each, at the next position
        slots = self._alloc_token_slots(len(self.running))
        for req, slot in zip(self.running, slots):
            self.caches.write_row(req, req.kv_len, [slot])
            req.kv_len += 1

    def _check_decode_mem(self, reqs: List[Request]) -> bool:
        self._evict_from_tree_cache(len(reqs))
        return self.caches.kv_available() >= len(reqs)

    def _retract_decode(self) -> None:
        """`ScheduleBatch.retract_decode`: requests are taken out, fewest outputs (and longest
        input) first, until decode fits; each is released without going into the tree
        (`release_req`) and goes back to the waiting queue to be matched again."""
        order = sorted(range(len(self.running)), key=lambda i: (len(self.running[i].output), -len(self.running[i].origin)), reverse=True)
        retracted = []
        first_iter = True
        while first_iter or not self._check_decode_mem([self.running[i] for i in order]):
            if len(order) == 1:
                if self.caches.kv_available() <= 0:
                    raise ReleaseRaised("AssertionError", "No space left for only one request")
                break
            first_iter = False
            req = self.running[order.pop()]
            retracted.append(req)
            self._release_req(req, len(order))
        self.running = [self.running[i] for i in order]
        decoded = sum(len(r.output) for r in self.running)
        budget = sum(r.max_new_tokens for r in self.running)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (budget + 1))
        self.on_event("retraction under decode memory pressure")
        for req in retracted:
            self.waiting.append(req)

    def _release_req(self, req: Request, remaining: int) -> None:
        """`ScheduleBatch.release_req`: free the request's memory without inserting it, make the
        freed tokens evictable at once, and reset the request for its next match."""
        self.caches.cache_finished_req(req, is_insert=False)
        self._evict_from_tree_cache(remaining * RETRACT_DECODE_STEPS)
        self.caches.reset_for_retract(req)

    def _process_batch_result_decode(self, batch: List[Request], tokens: Sequence[int]) -> None:
        """`process_batch_result_decode`: each request takes its token; a finished one goes into
        the tree (`cache_finished_req`), its frees grouped until the batch is done."""
        self.caches.free_group_begin()
        for i, req in enumerate(batch):
            self.caches.append_output(req, sampled_token(tokens, i))
            self._check_finished(req)
            if req.finished is not None:
                self.on_event("finish after decode")
                self.caches.cache_finished_req(req)
        self.caches.free_group_end()

    # ----- disaggregated prefill ---------------------------------------------------------------

    def _process_prefill_chunk(self) -> None:
        """`process_prefill_chunk` (disaggregation/prefill.py): the request being chunked goes
        into the tree and gives back its request slot, as the normal loop does, but with
        `req_to_token_pool.free(req_pool_idx)`, which frees its Mamba slot too."""
        if self.last_batch is not None and self.chunked is not None:
            self.caches.cache_unfinished_req(self.chunked, chunked=True)
            self.free_chunked_slot_disagg(self.chunked)
            self.batch_is_full = False

    def free_chunked_slot_disagg(self, req: Request) -> None:
        self.caches.req_free(req)
        self.on_event("chunked request's slot given back between chunks")

    def _process_batch_result_disagg_prefill(self, batch: List[Request], tokens: Sequence[int]) -> None:
        """`process_batch_result_disagg_prefill`: a request done with its input takes its first
        token, goes into the tree and keeps its lock while its KV is sent."""
        for i, req in enumerate(batch):
            if req.is_chunked > 0:
                req.is_chunked -= 1
                continue
            self.caches.append_output(req, sampled_token(tokens, i))
            self.caches.cache_unfinished_req(req)
            self.inflight.append(req)

    def _process_disagg_prefill_inflight_queue(self, transferred: int) -> None:
        """`process_disagg_prefill_inflight_queue`: a finished transfer (or a failed one, for an
        aborted request) unlocks the tree: `cache_finished_req`."""
        done, self.inflight = self.inflight[:transferred], self.inflight[transferred:]
        for req in done:
            req.finished = "abort" if req.to_abort else "length"
            self.on_event("KV transfer done")
            self.caches.cache_finished_req(req)

    # ----- idle -------------------------------------------------------------------------------

    def self_check_during_idle(self) -> None:
        """`self_check_during_idle`: `check_memory` (`_check_mamba_memory`, `_check_req_pool`),
        then `check_tree_cache` (the tree's `sanity_check`). Either raising kills the scheduler."""
        self.on_event("idle self-check")
        available, size = self.caches.kv_available(), self.config.kv_size
        full_evictable, full_protected, mamba_evictable, mamba_protected = self.caches.sizes()
        full_used = size - (available + full_evictable)
        mamba_used = self.config.mamba_size - (self.caches.mamba_available() + mamba_evictable)
        waiting_slots = sum(self.caches.cut.mamba_slot_of(r.cut) is not None for r in self.waiting)
        set_aside = self.tolerate("idle check", "a waiting request's Mamba slot") and mamba_used == mamba_protected + waiting_slots
        if full_used != full_protected or (mamba_used != mamba_protected and not set_aside):
            raise ReleaseRaised(
                "ValueError",
                f"token_to_kv_pool_allocator memory leak detected! full_available_size={available}, "
                f"full_evictable_size={full_evictable}, full_protected_size={full_protected}, "
                f"mamba_available_size={self.caches.mamba_available()}, mamba_evictable_size={mamba_evictable}, "
                f"mamba_protected_size={mamba_protected}",
            )
        if self.caches.req_available() != self.config.req_size:
            raise ReleaseRaised("ValueError", f"req_to_token_pool memory leak detected! available_size={self.caches.req_available()}")
        self.check_tree_cache()
        self.new_token_ratio = self.init_new_token_ratio

    def check_tree_cache(self) -> None:
        """`check_tree_cache`: the tree's own `sanity_check`."""
        try:
            self.caches.sanity_check()
        except Exception as exc:
            if not self.tolerate("idle check", f"sanity_check: {exc}"):
                raise ReleaseRaised(type(exc).__name__, f"sanity_check: {exc}") from exc
