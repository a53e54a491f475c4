"""`SchedulerProtocol`: what every scheduler protocol shares: the requests it holds, the
operations it accepts, and what the checks need to know of its requests.

A protocol is one release's scheduler transcribed, as far as it touches the tree cache and the
pools: each operation of the harness's vocabulary (`harness.operations`) is one scheduler event
(a request arrives, one turn of the event loop, an abort, a cache flush), and makes exactly the
calls that release's scheduler makes for it, through `PairedCaches`. A subclass names the
release's source for every call (file:function) so that `docs/scheduler-protocol.md` can map
each call site to the method that makes it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from harness.caches import cache_class, cache_name
from harness.caches.base import CacheUnderTest
from harness.checks.memory import RequestHoldings
from harness.checks.violation import Tolerate, never
from harness.operations import OperationError
from harness.pairing import PairedCaches, Request
from strategies.config import DISAGGREGATION_MODES, CacheConfig, SchedulerConfig, Setting, setting_refusal


class SchedulerProtocol:
    """One release's scheduler (see the module docstring)."""

    name = "abstract"
    # the operations this protocol accepts (a subset of `harness.operations.OPERATIONS`)
    operations: Tuple[str, ...] = ()
    # the server's disaggregation modes it runs (`SchedulerConfig.disaggregation_mode`)
    disaggregation_modes: Tuple[str, ...] = DISAGGREGATION_MODES

    # the server settings whose scheduler bookkeeping it drives: per `SERVER_SETTINGS` field,
    # the values it takes (a field not named: every value)
    settings_taken: Dict[str, Tuple[Setting, ...]] = {"mamba_strategy": ("no_buffer",), "event_loop": ("normal",), "page_size": (1,)}

    @classmethod
    def refusal(
        cls,
        cache_factory: Callable[[CacheConfig], CacheUnderTest],
        scheduler: Optional[SchedulerConfig] = None,
        config: Optional[CacheConfig] = None,
    ) -> str:
        """Why this protocol cannot drive the factory's caches, or run with the server settings
        `scheduler` and the pools `config` ("" when it can)."""
        if scheduler is not None and scheduler.disaggregation_mode not in cls.disaggregation_modes:
            return f"{cls.title()} runs disaggregation modes {list(cls.disaggregation_modes)} only, not {scheduler.disaggregation_mode!r}"
        if config is not None:
            settings = config.server_settings
            refused = setting_refusal(cls.settings_taken, settings)
            if refused:
                return f"{cls.title()} runs {refused}"
            refused = setting_refusal(cls.cache_settings_taken(cache_factory), settings)
            if refused:
                return f"{cache_name(cache_factory)} is built with {refused}"
        return ""

    @classmethod
    def cache_settings_taken(cls, cache_factory: Callable[[CacheConfig], CacheUnderTest]) -> Dict[str, Tuple[Setting, ...]]:
        """The server settings the cache this protocol runs the factory's programs on is built
        with (`CacheUnderTest.settings_taken`)."""
        return cache_class(cache_factory).settings_taken

    @classmethod
    def title(cls) -> str:
        """What it is, in a fuzz's first line."""
        return f"the {cls.name} scheduler"

    @classmethod
    def cache_for(cls, cache_factory: Callable[[CacheConfig], CacheUnderTest], config: CacheConfig, scheduler: SchedulerConfig) -> CacheUnderTest:
        """The cache under test a program under this protocol runs on: a new one."""
        return cache_factory(config)

    def __init__(
        self,
        caches: PairedCaches,
        config: CacheConfig,
        scheduler: SchedulerConfig,
        on_event: Callable[[str], None],
        tolerate: Tolerate = never,
    ):
        self.caches = caches
        self.config = config
        self.scheduler = scheduler
        self.on_event = on_event
        self.tolerate = tolerate  # whether a known finding is set aside here (see harness.findings)
        self._next_rid = 0

    def apply(self, op: str, args: Dict[str, Any]) -> None:
        if op not in self.operations:
            raise OperationError("op", f"the {self.name} scheduler has no operation {op!r} (it has {list(self.operations)})")
        getattr(self, op)(**args)

    def next_rid(self) -> int:
        rid = self._next_rid
        self._next_rid += 1
        return rid

    # ----- what the harness needs to know ------------------------------------------------------

    def referenced_requests(self) -> List[Request]:
        """Every request the scheduler refers to, in a stable order."""
        raise NotImplementedError

    def live_requests(self) -> List[Request]:
        """The referenced requests not yet released (they hold what the checks count)."""
        return [r for r in self.referenced_requests() if not r.released]

    def request(self, rid: int, operation: str) -> Request:
        """The live request `rid`, or an `OperationError` for a trace naming another."""
        for req in self.live_requests():
            if req.rid == rid:
                return req
        raise OperationError("args.rid", f"{operation}: no live request {rid} (live: {[r.rid for r in self.live_requests()]})")

    def holdings(self) -> List[RequestHoldings]:
        """What each live request owns and has computed, read from its row in the cache under
        test (after checking the row against the model's)."""
        cut = self.caches.cut
        live = self.live_requests()
        rows = cut.req_rows(max((r.kv_len for r in live), default=0))
        out = []
        for r in live:
            slot = r.model.req_slot
            row: Tuple[int, ...] = ()
            if slot is not None:
                row = tuple(rows[slot][: r.kv_len])
                want = tuple(r.model.row.get(i) for i in range(r.kv_len))
                self.caches.agree(f"the req_to_token row of request {r.rid}", "its KV slots", row, want)
            out.append(
                RequestHoldings(
                    rid=r.rid,
                    kv=row[r.prefix_len :],
                    mamba=cut.mamba_slot_of(r.cut),
                    req_slot=slot,
                    extra_key=r.extra_key,
                    tokens=r.tokens(),
                    row=row,
                    state_len=r.state_len,
                )
            )
        return out

    def node_holders(self) -> Iterable[Any]:
        """The cache under test's requests that may refer to tree nodes: the referenced ones."""
        return [r.cut for r in self.referenced_requests()]

    def held_nodes(self) -> Iterable[Any]:
        """The tree nodes the scheduler's requests refer to (`node_holders`,
        `CacheUnderTest.nodes_of`, and those nodes' ancestors): alive whether or not they are
        still in the tree."""
        cut = self.caches.cut
        for req in self.node_holders():
            for handle in cut.nodes_of(req):
                node = cut.node_object(handle)
                while node is not None:
                    yield node
                    node = node.parent
