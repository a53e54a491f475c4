"""`OperationChooser`: what could happen next, chosen with a scenario's weights.

Given the driver's state it lists the operations its protocol offers and that fit now, picks one
from the scenario's weighted mix and picks its arguments, all through a `Draws` (Hypothesis or
seeded random), and keeps the corpus of sequences that later prompts reuse prefixes of (earlier
prompts, and conversations so far: a prompt extended by its answer).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from harness.driver import Driver
from strategies import Scenario
from strategies.draws import Draws
from strategies.scenarios import weighted_operations

CORPUS_LIMIT = 24
LIVE_LIMIT = 6  # requests in the scheduler at once: a longer queue only exhausts the pools
AVOID_REDRAWS = 8


class OperationChooser:
    """Chooses operations (name, arguments) for one program."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.corpus: List[tuple] = []
        self._weighted: Dict[Tuple[str, ...], Tuple[str, ...]] = {}
        # what the forward pass samples: a prompt token, or now and then the eos token
        self._samples = tuple(range(scenario.vocab)) * scenario.eos_odds + (scenario.eos,)

    def applicable(self, driver: Driver) -> List[str]:
        protocol = driver.protocol
        offered = set(protocol.operations)
        live = protocol.live_requests()
        pins = getattr(protocol, "pins", ())
        ops = ["iterate", "flush"]
        # a direct user's locks and a serving scheduler starve each other: locks are taken only
        # while no request is in the scheduler, and requests arrive only once they are released
        if len(live) < LIVE_LIMIT and not pins:
            ops.append("arrive")
        if live:
            ops.append("abort")
        ops += [op for op in ("insert", "match", "unlock_unlocked", "evict", "evict_mamba", "cow_match", "req_slots") if op in offered]
        if "lock" in offered and not live:
            ops.append("lock")
        if "unlock" in offered and pins:
            ops.append("unlock")
        if "lock_evicted" in offered and driver.cut.refuses_detached_nodes and protocol.evicted_nodes():
            ops.append("lock_evicted")
        return ops

    def remember(self, tokens) -> None:
        tokens = tuple(tokens)
        if tokens and tokens not in self.corpus:
            self.corpus.append(tokens)
            del self.corpus[:-CORPUS_LIMIT]

    def next(self, driver: Driver, draws: Draws) -> Tuple[str, Dict[str, Any]]:
        """The next operation and its arguments: one a known finding set aside avoids is drawn
        again (a few times, then a turn of the event loop instead)."""
        for _ in range(AVOID_REDRAWS):
            op, args = self._draw(driver, draws)
            if not driver.set_aside.avoids(op, args, driver):
                return op, args
        return "iterate", {"tokens": [], "transferred": 0}

    def _draw(self, driver: Driver, draws: Draws) -> Tuple[str, Dict[str, Any]]:
        s = self.scenario
        applicable = tuple(self.applicable(driver))
        if applicable not in self._weighted:
            self._weighted[applicable] = weighted_operations(s.mix, applicable)
        op = draws.pick(self._weighted[applicable], "operation")
        live = driver.protocol.live_requests()

        def tokens(min_len: int = 1) -> list:
            return list(draws.tokens(self.corpus, s, min_len, "tokens"))

        def extra_key():
            return s.extra_keys[0] if len(s.extra_keys) == 1 else draws.pick(s.extra_keys, "extra_key")

        if op == "arrive":
            for req in live:
                self.remember(req.tokens())  # the conversation so far, for a next turn to extend
            args = {"tokens": tokens(), "extra_key": extra_key(), "max_new_tokens": draws.integer(1, s.max_new, "max_new_tokens")}
            self.remember(args["tokens"])
        elif op == "iterate":
            inflight = len(getattr(driver.protocol, "inflight", ()))
            sampled = [draws.pick(self._samples, "sampled token") for _ in live]
            args = {"tokens": sampled, "transferred": draws.integer(0, inflight, "transfers done") if inflight else 0}
        elif op == "abort":
            args = {"rid": draws.pick(tuple(r.rid for r in live), "request")}
        elif op == "flush":
            args = {}
        elif op in ("insert", "lock", "unlock_unlocked"):
            args = {"tokens": tokens(), "extra_key": extra_key()}
            if op == "insert":
                self.remember(args["tokens"])
        elif op == "match":
            args = {"tokens": tokens(min_len=0), "extra_key": extra_key()}
        elif op == "evict":
            args = {"num_tokens": draws.integer(0, 2 * s.max_len, "num_tokens")}
        elif op == "evict_mamba":
            args = {"num": draws.integer(0, 3, "num")}
        elif op == "cow_match":
            args = {"tokens": tokens(), "extra_key": extra_key(), "own_slot": draws.flag("own slot")}
        elif op == "req_slots":
            args = {"count": draws.integer(1, driver.config.req_size + 1, "requests")}
        elif op == "lock_evicted":
            args = {"index": draws.integer(0, len(driver.protocol.evicted_nodes()) - 1, "evicted node")}
        else:
            args = {"index": draws.integer(0, len(driver.protocol.pins) - 1, "pin")}
        return op, args
