"""`ContractScheduler`: what a correct scheduler of SGLang 0.5.4's era does, the protocol `impl`
is checked under.

It makes 0.5.4's calls (`Sglang054Scheduler`) with the scheduler's own mistakes corrected, each
as a later release corrected it, and adds the direct API calls (`DirectApi`). The cache under
test then only has to honour the cache's contract: every call 0.5.4's scheduler makes, with its
arguments, is made here too (`cache_finished_req(req, is_insert=False)` on retraction,
`match_prefix(rid=...)` under the lpm policy, and so on). Running `impl` under
`Sglang054Scheduler` instead shows which findings are the scheduler's and not the cache's.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from harness.checks.violation import never
from harness.pairing import Request
from harness.protocols.direct_api import DIRECT_OPERATIONS, DirectApi
from harness.protocols.sglang_0_5_4 import PrefillAdder, Sglang054Scheduler


class ContractAdder(PrefillAdder):
    """0.5.4's adder, with a chunk never cut to nothing: with the budget spent the request being
    chunked still takes a whole chunk (0.5.4 cut it to zero or fewer tokens, its fill_ids below
    its prefix; fixed by 0.5.15's "replaced with rem_chunk_tokens")."""

    def chunk_budget(self) -> int:
        budget = super().chunk_budget()
        return budget if budget > 0 else self.rem_chunk_tokens


class ContractScheduler(DirectApi, Sglang054Scheduler):
    """0.5.4's scheduler with its mistakes corrected, plus direct API calls on a cache that
    offers a direct API (`CacheUnderTest.direct_api`)."""

    name = "contract"
    operations = Sglang054Scheduler.operations + DIRECT_OPERATIONS
    adder_class = ContractAdder

    def __init__(self, caches, config, scheduler, on_event, tolerate=never):
        super().__init__(caches, config, scheduler, on_event, tolerate)
        self.pins: List[Tuple[Any, Any]] = []
        if not caches.cut.direct_api:
            self.operations = Sglang054Scheduler.operations  # a cache only a scheduler drives

    def refused(self, req: Request) -> None:
        """A request the adder turned down gives back the Mamba slot its copy-on-write filled
        (0.5.4 kept it: a waiting request then held a slot no idle check accounts for, and an
        abort leaked it; fixed by 0.5.15's "revert matched mamba idx")."""
        super().refused(req)
        if self.caches.cut.mamba_slot_of(req.cut) is not None:
            self.caches.mamba_free(req)

    def _release_req(self, req: Request, remaining: int) -> None:
        """A retracted request also lets go of its request slot (0.5.4 left `req_pool_idx` set,
        so its next match, with copy-on-write, met the cache's assert that it has none; later
        releases free the slot through the request, which clears it)."""
        super()._release_req(req, remaining)
        self.caches.forget_req_slot(req)

    def free_chunked_slot_disagg(self, req: Request) -> None:
        """The chunked request keeps its Mamba slot between chunks in disaggregated prefill too
        (0.5.4 freed it there while the request went on using it)."""
        self.free_chunked_slot(req)

    def flushable(self) -> bool:
        """A flush waits until no request is left at all (0.5.4 looked only at the waiting queue
        and the running batch, and flushed under the request being chunked, a prefill batch not
        yet merged into the running batch, and in-flight transfers, clearing slots they held), and
        until no direct user holds a lock."""
        return not self.live_requests() and not self.pins

    def check_tree_cache(self) -> None:
        """The tree's self-check runs when nothing at all holds a lock: it asserts that no node
        is locked, which a direct user's pin contradicts while the scheduler idles."""
        if not self.pins:
            super().check_tree_cache()

    def held_nodes(self):
        yield from super().held_nodes()
        for node, _ in self.pins:
            yield node
