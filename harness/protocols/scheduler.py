"""`RealSchedulerProtocol` (`--protocol scheduler`): the release's own `Scheduler`, not a
transcription of it (`harness.real_scheduler`).

Each operation is what the tokenizer or the server sends, through the scheduler's receive
socket, or one turn of its event loop:

  arrive    a `TokenizedGenerateReqInput` (rid: the protocol's next number)
  iterate   one turn of `event_loop_normal`; the forward pass samples `tokens[i % len]` for the
            i-th request of its batch (no disaggregation: `transferred` must be 0)
  abort     an `AbortReq` for a live request
  flush     a `FlushCacheReqInput`

The calls the scheduler makes on the tree and the pools are made on the reference model too
(`ModelMirror`, `harness.protocols.scheduler_mirror`), so every check runs after every
operation, and SGLang's invariant checker runs strict where the scheduler runs it. What each live
request owns is read from SGLang's own `Req` (its row `[cache_protected_len,
kv_allocated_len)`, its Mamba slot, its request slot), what it has computed from the stand-in
forward pass's own record, never from SGLang's bookkeeping.

The scheduler is built once per process and configuration (`Runtimes`) and reset between
programs as a server would be: every live request aborted, turns until none is left, a cache
flush, then the scheduler's per-run counters and the pools' data as a fresh build has them. A
scheduler that does not come back idle is built anew.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from harness.caches.base import CacheUnderTest
from harness.checks.memory import RequestHoldings
from harness.checks.violation import never
from harness.operations import OperationError
from harness.pairing import model_as_built
from harness.protocols.base import SchedulerProtocol
from harness.protocols.scheduler_mirror import mirror_class
from harness.real_scheduler import real_scheduler_class
from strategies.config import EVENT_LOOPS, MAMBA_STRATEGIES, PAGE_SIZES, CacheConfig, SchedulerConfig, Setting

# turns a reset waits for aborted requests to leave the scheduler before building it anew
RESET_TURNS = 8


@dataclass(eq=False)
class LiveRequest:
    """One of the scheduler's requests, as the harness's chooser and checks name it: SGLang's
    `Req` (`cut`) with its rid as the number the protocol gave it."""

    rid: int
    origin: Tuple[int, ...]
    max_new_tokens: int
    extra_key: Optional[str]
    cut: Any

    def tokens(self) -> Tuple[int, ...]:
        """Its tokens as the scheduler holds them: a request it aborts for its length holds the
        one token [0] from then (`Req.set_finish_with_abort`), and keeps its row until the
        batch that prefills it is processed (a turn later under the overlap loop)."""
        return tuple(self.cut.origin_input_ids) + tuple(self.cut.output_ids)


class Runtimes:
    """The process's real scheduler, over a cache under test built for it: one at a time (each
    build tears down the process groups the last one set up), kept while programs run on the
    same cache, configuration and scheduler settings, built anew for another."""

    def __init__(self) -> None:
        self._key: Optional[Tuple[str, CacheConfig, SchedulerConfig]] = None
        self._runtime: Any = None

    def ready(self, cache_factory: Any, config: CacheConfig, scheduler: SchedulerConfig) -> Any:
        """A real scheduler, idle, with an empty cache and every slot free."""
        from harness.caches import cache_name

        key = (cache_name(cache_factory), config, scheduler)
        if key == self._key and _reset(self._runtime):
            return self._runtime
        self._key = self._runtime = None
        refusal = RealSchedulerProtocol.refusal(cache_factory, scheduler, config)
        if refusal:
            raise ValueError(refusal)
        release, build = _scheduler_cache(cache_factory)
        self._runtime = real_scheduler_class(release)(build(config), config, scheduler)
        self._runtime.mirror = mirror_class(release)(self._runtime)
        self._key = key
        return self._runtime

    def of(self, cut: CacheUnderTest) -> Any:
        """The scheduler `ready` built over `cut`; ValueError for a cache it did not build
        (`RealSchedulerProtocol.cache_for` gives the cache a program runs on)."""
        if self._runtime is None or self._runtime.cut is not cut:
            raise ValueError(f"{cut.name} was not built for the real scheduler: build it with RealSchedulerProtocol.cache_for")
        return self._runtime


def _scheduler_cache(cache_factory: Any) -> Tuple[str, Any]:
    """The SGLang release whose scheduler runs a factory's programs, and what builds the cache it
    runs them on: SGLang's own `UnifiedRadixCache`, or impl's tree registered in its place
    (`harness.caches.impl_in_sglang`)."""
    from harness.caches import ImplCache, cache_class, cache_release
    from harness.caches.sglang_loader import sglang_version

    if not issubclass(cache_class(cache_factory), ImplCache):
        return cache_release(cache_factory), cache_factory
    from harness.caches.impl_in_sglang import ImplInSglangCache

    tree_class = cache_factory.keywords["cache_class"] if isinstance(cache_factory, functools.partial) else None
    build = ImplInSglangCache if tree_class is None else functools.partial(ImplInSglangCache, cache_class=tree_class)
    return sglang_version(), build


def _reset(runtime: Any) -> bool:
    """Bring a scheduler back to idle the way a server operator would (abort everything, let it
    drain, flush), and its counters and the pools' data to a fresh build's; whether it worked."""
    runtime.mirror.attach(None)
    try:
        for req in runtime.live_requests():
            runtime.abort(req.rid)
        cut = runtime.cut
        for _ in range(RESET_TURNS):
            if not runtime.live_requests():
                runtime.flush()  # refused while a batch's results wait (the overlap loop): a turn more
                if cut.sizes() == (0, 0, 0, 0) and _as_built(cut):
                    break
            runtime.turn()
        runtime.restart_counters()
        cut.wipe_data()
        return not runtime.live_requests() and cut.sizes() == (0, 0, 0, 0) and _as_built(cut)
    except Exception:  # a scheduler a failed program left broken: built anew
        return False


def _as_built(cut: CacheUnderTest) -> bool:
    """Whether every pool's free list is what a fresh build has (a flush clears the pools)."""
    fresh = model_as_built(cut.config, cut.rules)
    return (cut.kv_free_slots(), cut.mamba_free_slots(), cut.req_free_slots()) == (fresh.kv_free, fresh.mamba_free, fresh.req_free)


RUNTIMES = Runtimes()


class RealSchedulerProtocol(SchedulerProtocol):
    """The release's own scheduler (see the module docstring)."""

    name = "scheduler"
    operations = ("arrive", "iterate", "abort", "flush")
    disaggregation_modes = ("null",)  # the disaggregation bootstrap and transfer queues are not built
    settings_taken = {"mamba_strategy": MAMBA_STRATEGIES, "event_loop": EVENT_LOOPS, "page_size": PAGE_SIZES}

    @classmethod
    def title(cls) -> str:
        return "the release's own scheduler"

    @classmethod
    def refusal(cls, cache_factory: Any, scheduler: Optional[SchedulerConfig] = None, config: Optional[CacheConfig] = None) -> str:
        """The real scheduler runs SGLang's `UnifiedRadixCache` on one tree core, or impl's tree
        in its place, on a release the harness builds its scheduler for, with no disaggregation."""
        from harness.caches import ImplCache, cache_class, cache_name, cache_release
        from harness.caches.sglang_loader import sglang_unavailable, sglang_version
        from harness.caches.sglang_unified import SglangUnifiedCache
        from harness.real_scheduler import RELEASES

        name, built = cache_name(cache_factory), cache_class(cache_factory)
        if issubclass(built, ImplCache):  # impl's tree inside the installed release's scheduler
            reason = sglang_unavailable()
            if reason:
                return f"--protocol scheduler runs {name} inside SGLang's own scheduler: {reason}"
            from harness.caches.impl_in_sglang import SPEAKS

            release = sglang_version()
            if release not in SPEAKS:
                return f"--protocol scheduler runs {name} inside SGLang {list(SPEAKS)}'s scheduler (their tree-cache API), not {release}'s"
        elif issubclass(built, SglangUnifiedCache):
            release = cache_release(cache_factory)
        else:
            return f"--protocol scheduler drives SGLang's UnifiedRadixCache on one tree core (--impl sglang-python or sglang-rust) or impl, not {name}"
        if release not in RELEASES:
            return f"--protocol scheduler: the release's own scheduler is built for SGLang {sorted(RELEASES)} only, not {release}"
        return super().refusal(cache_factory, scheduler, config)

    @classmethod
    def cache_settings_taken(cls, cache_factory: Any) -> Dict[str, Tuple[Setting, ...]]:
        """impl runs here as its tree inside the scheduler (`ImplInSglangCache`)."""
        from harness.caches import ImplCache, cache_class
        from harness.caches.impl_in_sglang import ImplInSglangCache

        if issubclass(cache_class(cache_factory), ImplCache):
            return ImplInSglangCache.settings_taken
        return super().cache_settings_taken(cache_factory)

    @classmethod
    def cache_for(cls, cache_factory: Any, config: CacheConfig, scheduler: SchedulerConfig) -> CacheUnderTest:
        """The cache under test of the scheduler this configuration's programs run on."""
        return RUNTIMES.ready(cache_factory, config, scheduler).cut

    def __init__(self, caches, config, scheduler, on_event, tolerate=never):
        super().__init__(caches, config, scheduler, on_event, tolerate)
        self.runtime = RUNTIMES.of(caches.cut)
        self.runtime.record_digests = caches.record_digests
        self.runtime.mirror.attach(caches)
        self._requests: Dict[str, LiveRequest] = {}

    # ----- the operations ---------------------------------------------------------------------

    def arrive(self, tokens: List[int], extra_key: Optional[str], max_new_tokens: int) -> None:
        rid = self.next_rid()
        self.runtime.arrive(str(rid), tokens, extra_key, max_new_tokens)
        self._requests[str(rid)] = LiveRequest(rid, tuple(tokens), max_new_tokens, extra_key, None)

    def iterate(self, tokens: List[int], transferred: int) -> None:
        if transferred:
            raise OperationError("args.transferred", f"the scheduler runs no disaggregation: nothing is in flight, got {transferred}")
        self.runtime.turn(tokens)

    def abort(self, rid: int) -> None:
        self.request(rid, "abort")
        self.runtime.abort(str(rid))

    def flush(self) -> None:
        self.runtime.flush()

    # ----- what the harness needs to know ------------------------------------------------------

    def referenced_requests(self) -> List[LiveRequest]:
        """The views of the scheduler's live requests; a view of one no longer live lets go of
        SGLang's `Req` (the harness must not keep alive what the scheduler dropped)."""
        out = []
        for req in self.runtime.live_requests():
            view = self._requests.get(req.rid)
            if view is None:  # a request the harness did not send: a finding of its own
                raise AssertionError(f"the scheduler holds request {req.rid!r}, which the program never sent")
            view.cut = req
            out.append(view)
        live = {id(view) for view in out}
        for view in self._requests.values():
            if id(view) not in live:
                view.cut = None
        return out

    def live_requests(self) -> List[LiveRequest]:
        return self.referenced_requests()

    def node_holders(self) -> Iterable[Any]:
        """Every request the scheduler still refers to, finished ones too (a finished request
        stays in the running batch until the next turn)."""
        return self.runtime.held_requests()

    def holdings(self) -> List[RequestHoldings]:
        """Per live request: the KV slots its row owns (`[cache_protected_len,
        kv_allocated_len)`), its Mamba and request slots as SGLang's `Req` holds them; the row
        positions and the state the stand-in forward pass computed for it."""
        live = self.live_requests()
        cut = self.caches.cut
        rows = cut.req_rows(max((cut.allocated_len_of(r.cut) for r in live), default=0))
        out = []
        for r in live:
            slot = cut.req_slot_of(r.cut)
            row = () if slot is None else tuple(rows[slot][: cut.allocated_len_of(r.cut)])
            out.append(
                RequestHoldings(
                    rid=r.rid,
                    kv=row[cut.protected_len_of(r.cut) :],
                    mamba=cut.mamba_slot_of(r.cut),
                    req_slot=slot,
                    extra_key=r.extra_key,
                    tokens=r.tokens(),
                    row=row[: self.runtime.computed_len(r.cut)],
                    state_len=self.runtime.state_len(r.cut),
                    tracks=tuple((track, self.runtime.track_len(r.cut, track)) for track in cut.track_slots_of(r.cut)),
                )
            )
        return out
