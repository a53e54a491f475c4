"""`OperationChooser`: what a scheduler could do next, chosen with a scenario's weights.

Given the driver's state it lists the applicable operations, picks one from the scenario's
weighted mix and picks its arguments, all through a `Draws` (Hypothesis or seeded random), and
keeps the corpus of sequences that later requests reuse prefixes of.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from harness.driver import PairedScheduler
from strategies import Scenario
from strategies.draws import Draws
from strategies.scenarios import weighted_operations

CORPUS_LIMIT = 24
WAITING_LIMIT = 3  # a scheduler admits or drops requests; an ever-growing queue only exhausts pools


class OperationChooser:
    """Chooses operations (name, arguments) for one program."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.corpus: List[tuple] = []
        self._weighted: Dict[Tuple[str, ...], Tuple[str, ...]] = {}

    def _in_phase(self, driver: PairedScheduler, phase: str) -> List[int]:
        return sorted(rid for rid, live in driver.requests.items() if live.phase == phase)

    def _decodable(self, driver: PairedScheduler) -> List[int]:
        limit = driver.config.max_context_len - 1
        return [rid for rid in self._in_phase(driver, "decode") if driver.requests[rid].kv_len < limit]

    def applicable(self, driver: PairedScheduler) -> List[str]:
        ops = ["evict", "evict_mamba", "insert", "match", "lock", "unlock_unlocked"]
        phases = [live.phase for live in driver.requests.values()]
        waiting = phases.count("waiting")
        if waiting < WAITING_LIMIT:
            ops.append("start_request")
        if waiting:
            ops += ["admit", "rematch", "abort"]
        if "prefill" in phases:
            ops.append("prefill_chunk")
        if "decode" in phases:
            if self._decodable(driver):
                ops.append("decode")
            ops.append("finish")
        if driver.pins:
            ops.append("unlock")
        if driver.adapter.refuses_detached_nodes and driver.evicted_nodes():
            ops.append("lock_evicted")
        return ops

    def remember(self, tokens) -> None:
        tokens = tuple(tokens)
        if tokens and tokens not in self.corpus:
            self.corpus.append(tokens)
            del self.corpus[:-CORPUS_LIMIT]

    def next(self, driver: PairedScheduler, draws: Draws) -> Tuple[str, Dict[str, Any]]:
        """The next operation and its arguments."""
        s = self.scenario
        applicable = tuple(self.applicable(driver))
        if applicable not in self._weighted:
            self._weighted[applicable] = weighted_operations(s.mix, applicable)
        op = draws.pick(self._weighted[applicable], "operation")

        def tokens(min_len: int = 1) -> list:
            return list(draws.tokens(self.corpus, s, min_len, "tokens"))

        def extra_key():
            return s.extra_keys[0] if len(s.extra_keys) == 1 else draws.pick(s.extra_keys, "extra_key")

        def request(phase_rids: List[int]) -> int:
            return draws.pick(tuple(phase_rids), "request")

        if op == "start_request":
            args = {"tokens": tokens(), "extra_key": extra_key(), "cow": draws.pick((True, True, True, False), "cow_mamba")}
            self.remember(args["tokens"])
        elif op in ("admit", "prefill_chunk"):
            rid = request(self._in_phase(driver, "waiting" if op == "admit" else "prefill"))
            args = {
                "rid": rid,
                "chunk": draws.integer(1, s.max_chunk, "chunk"),
                "first_output": draws.integer(0, s.vocab - 1, "first_output"),
            }
        elif op in ("rematch", "abort"):
            args = {"rid": request(self._in_phase(driver, "waiting"))}
        elif op == "decode":
            args = {"rid": request(self._decodable(driver)), "token": draws.integer(0, s.vocab - 1, "token")}
        elif op == "finish":
            rid = request(self._in_phase(driver, "decode"))
            live = driver.requests[rid]
            self.remember(live.model_req.origin + tuple(live.model_req.output))
            args = {"rid": rid}
        elif op == "evict":
            args = {"num_tokens": draws.integer(0, 2 * s.max_len, "num_tokens")}
        elif op == "evict_mamba":
            args = {"num": draws.integer(0, 3, "num")}
        elif op == "insert":
            args = {"tokens": tokens(), "extra_key": extra_key()}
            self.remember(args["tokens"])
        elif op == "match":
            args = {"tokens": tokens(min_len=0), "extra_key": extra_key()}
        elif op in ("lock", "unlock_unlocked"):
            args = {"tokens": tokens(), "extra_key": extra_key()}
        elif op == "lock_evicted":
            args = {"index": draws.integer(0, len(driver.evicted_nodes()) - 1, "evicted node")}
        else:
            args = {"index": draws.integer(0, len(driver.pins) - 1, "pin")}
        return op, args
