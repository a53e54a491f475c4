"""`Driver`: one program's run. A scheduler protocol drives the cache under test and the reference
model side by side (`PairedCaches`), and every check runs after every step.

The protocol is the release's scheduler (or, for `impl`, the contract: 0.5.4's calls with its
scheduler's mistakes corrected); `operations` records each operation applied, in trace form;
`set_aside` names the known findings the checks pass over (`harness.findings`).
`paused_gc()` pauses Python's cyclic collector while a program runs, so that the memory check
sees what reference counting alone reclaims (and sees it the same way on every replay).
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from harness.caches import CacheFactory, ImplCache
from harness.caches.base import storage_of
from harness.checks import (
    OUTSIDE_CHECKS,
    STRUCTURAL_CHECKS,
    NodeReclamation,
    index_types,
    own_storage,
    pool_index_types,
    pool_conservation,
    request_meaning,
    tree_meaning,
    tree_slots_meaning,
)
from harness.findings import SetAside
from harness.operations import check_arguments
from harness.pairing import PairedCaches, model_as_built
from harness.protocols import protocol_class, protocol_for
from harness.signature import INVARIANT, Signature, signature_of
from strategies.config import CacheConfig, SchedulerConfig

# the checks by name; a driver may run fewer (to show which one alone catches a seeded bug)
# (`handed_tensors`: the tensors handed to the cache are overwritten once their caller is done)
CHECKS = frozenset(
    {"structure", "pool_conservation", "meaning", "index_types", "own_storage", "handed_tensors", "node_reclaimed"}
)


def pause_gc() -> bool:
    """Turn the cyclic collector off, every object so far frozen out of its reach (so that an
    explicit collection looks only at what is made from now on, cheaply, however large the
    heap); returns whether it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    return was_enabled


# How often `resume_gc` collects every generation, in seconds. Whatever was alive when the
# collector was paused (a program Hypothesis has not let go of yet, say) goes back into the
# oldest generation at `unfreeze`, and with the collector off most of the time nothing else
# would ever collect it there: without this a Hypothesis fuzz grew by megabytes a second.
FULL_COLLECTION_INTERVAL = 5.0
_last_full_collection = time.monotonic()


def resume_gc(was_enabled: bool) -> None:
    """Undo `pause_gc`, collecting what was made meanwhile (nothing was collected, and so nothing
    promoted, while it was off: all of it is in the youngest generation), and every generation
    once every `FULL_COLLECTION_INTERVAL` seconds."""
    global _last_full_collection
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    now = time.monotonic()
    if now - _last_full_collection >= FULL_COLLECTION_INTERVAL:
        gc.collect()
        _last_full_collection = now
    else:
        gc.collect(0)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector paused (`pause_gc`, `resume_gc`)."""
    was_enabled = pause_gc()
    try:
        yield
    finally:
        resume_gc(was_enabled)


class Driver:
    """A cache under test, the model and a scheduler protocol, built from one configuration."""

    def __init__(
        self,
        config: CacheConfig,
        scheduler: SchedulerConfig = SchedulerConfig(),
        cache_factory: CacheFactory = ImplCache,
        protocol: Optional[str] = None,
        on_event: Callable[[str], None] = lambda label: None,
        set_aside: SetAside = SetAside(),
        checks: FrozenSet[str] = CHECKS,
    ):
        self.config = config
        self.scheduler = scheduler
        self.on_event = on_event
        self._passed_over: Set[Tuple[str, str]] = set()  # (check, what) set aside so far in this program
        protocol = protocol or protocol_for(cache_factory, scheduler, config)
        refusal = protocol_class(protocol).refusal(cache_factory, scheduler, config)
        if refusal:
            raise ValueError(refusal)
        self.cut = protocol_class(protocol).cache_for(cache_factory, config, scheduler)
        self.set_aside = set_aside.for_release(self.cut.release, self.cut.scheduler_release)
        self.model = model_as_built(config, self.cut.rules)
        unknown = set(checks) - CHECKS
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; known: {sorted(CHECKS)}")
        self.checks = on = frozenset(checks)
        self.caches = PairedCaches(
            self.cut, self.model, on_event, check_meaning="meaning" in on, overwrite_handed="handed_tensors" in on
        )
        self.protocol_name = protocol
        self.protocol = protocol_class(self.protocol_name)(self.caches, config, scheduler, on_event, self.tolerate)
        self.operations: List[Dict[str, Any]] = []
        self.reclamation = NodeReclamation()

    def apply(self, op: str, **args: Any) -> None:
        """Record one operation of the vocabulary (`harness.operations`) and run it."""
        check_arguments(op, args)
        self.operations.append({"op": op, "args": dict(args)})
        self.caches.calls = []
        self.protocol.apply(op, args)

    def tolerate(self, check: str, what: str) -> bool:
        """Whether a check passes over this kind of failure (`SetAside.tolerates`); the first time
        in a program it does, the event `set aside: check | what` says so (a fuzz counts them)."""
        if not self.set_aside.tolerates(check, what):
            return False
        if (check, what) not in self._passed_over:
            self._passed_over.add((check, what))
            self.on_event(f"set aside: {Signature(INVARIANT, check, what).key}")
        return True

    def signature(self, exc: BaseException) -> Signature:
        """The signature of a failure of this program (`harness.signature`): a check run between
        operations failed after the last one, and after the last call it made."""
        step = None
        if self.operations:
            step = self.operations[-1]["op"]
            if self.caches.calls:
                step += f" (last call {self.caches.calls[-1]})"
        return signature_of(exc, step)

    def check(self) -> None:
        """Every check (of `checks`), recomputed from the cache under test's state."""
        cut, on = self.cut, self.checks
        snap = cut.snapshot()
        readable = snap.nodes is not None
        if "structure" in on:
            for check in STRUCTURAL_CHECKS if readable else OUTSIDE_CHECKS:
                check(snap, self.model)
        holdings = self.protocol.holdings()
        if "pool_conservation" in on:
            pool_conservation(snap, self.model, holdings)
        if "meaning" in on:
            kv_data, states = cut.kv_data(), cut.state_digests()
            if readable:
                tree_meaning(snap, kv_data, states, self.caches.name_digest)
            else:
                tree_slots_meaning(snap, kv_data, states, self.caches.prefixes.__contains__, self.caches.name_digest)
            request_meaning(holdings, kv_data, states, self.caches.name_digest)
        tolerate = self.tolerate
        if "index_types" in on:
            pool_index_types(cut.req_pool)
            index_types(snap, cut.device, tolerate)
        if "own_storage" in on:
            own_storage(snap, [storage_of(t) for t in cut.free_list_tensors()], storage_of(cut.request_rows()), tolerate)
        if "node_reclaimed" in on and cut.node_objects:
            self.reclamation.check(snap, self.protocol.held_nodes(), cut.cache.root_node, tolerate)
