"""Known findings, and setting failures aside while the fuzzer looks for others.

A frequent finding would hide the rarer ones: every program would stop at it. Each known finding
of a release says what identifies it (the check it fails and what the failure names) and how it
is set aside for that release: a check passes over that one instance (`tolerates`), the operation
that triggers it is not chosen (`avoids`), or the server settings that reach it are not drawn
(`settings`). `docs/findings.md` writes each one up; `python -m harness fuzz --set-aside NAME`
(or `--set-aside all`, every finding of the release under test) applies them.

A failure not judged yet is set aside by its signature (`harness.signature`): `--set-aside
TRACE.json` or `--set-aside 'check | what ...'`, and a fuzz sets aside each new signature it
finds for the rest of the run. A check that can go on past a failure passes over an invariant's
signature (`tolerates`); any other covered failure ends its program quietly (`covers`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from harness.caches.sglang_releases import MAMBA_ERAS, RELEASES, is_development, release_range
from harness.checks import TOLERABLE_CHECKS
from harness.signature import INVARIANT, Signature, parse_key
from strategies.config import SchedulerConfig


class KnownFinding:
    """One finding in one release, with how to set it aside (see the module docstring)."""

    name = "abstract"
    # the releases it affects (`CacheUnderTest.release`): from `python -m harness releases` over
    # every release, or for a fault of a scheduler from reading each release's call sites
    releases: Tuple[str, ...] = ()
    check = ""  # the check it fails
    summary = ""  # one line: what goes wrong
    set_aside = ""  # one line: how a fuzz sets it aside
    # whether the fault is in the release's scheduler (its calls or missing clean-ups), not in the
    # cache: a replay judges it only under that release's own transcribed scheduler
    in_scheduler = False
    # (check, what): the one instance a check passes over when the finding is set aside
    tolerated: Optional[Tuple[str, str]] = None
    # for a finding no check tolerates: words its failures' signatures hold (`Signature.key`)
    marks: Tuple[str, ...] = ()

    def meets(self, release: str) -> bool:
        """Whether a run on `release` can meet this finding: a release it affects, or, for a fault
        of 0.5.4's scheduler, any release that scheduler's transcription drives by default (the
        releases with 0.5.4's keyword API: `harness.caches.sglang_releases`). A development
        version meets the findings of the newest release (until a fuzz shows them fixed)."""
        if release in self.releases or (is_development(release) and RELEASES[-1] in self.releases):
            return True
        return self.in_scheduler and release in release_range(*MAMBA_ERAS["kwargs"])

    def tolerates(self, check: str, what: str) -> bool:
        """Whether `check` passes over one instance of this finding (`what` names it)."""
        return self.tolerated == (check, what)

    def matches(self, signature: Signature) -> bool:
        """Whether a failure with `signature` is this finding: the instance it tolerates, or,
        for a finding set aside otherwise, a failure of its check whose signature holds its
        `marks`."""
        if self.tolerated is not None and self.tolerated[0] in TOLERABLE_CHECKS:
            return signature.kind == INVARIANT and self.tolerates(signature.check, signature.what)
        return signature.check == self.check and all(mark in signature.key for mark in self.marks)

    @property
    def precise(self) -> bool:
        """Whether its signature alone identifies it: a check passes over just its instance, or
        its marks are all it is set aside by. A finding set aside by the operations or settings
        it needs is only the failure of a trace that takes them (`harness.trace.finding_of`)."""
        return type(self).avoids is KnownFinding.avoids and type(self).settings is KnownFinding.settings

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        """Whether the operation would trigger this finding and is not to be chosen."""
        return False

    def settings(self, scheduler: SchedulerConfig) -> SchedulerConfig:
        """The server settings a program draws, changed so as not to reach this finding."""
        return scheduler


class MambaForkViewsFreeList(KnownFinding):
    name = "mamba-fork-views-free-list"
    releases = release_range("0.5.3.post2", "0.5.23")
    check = "own_storage"
    summary = (
        "caching a running request stores the Mamba slot it allocates for the node as the allocator hands it out, "
        "a view of the free-slot tensor (0.5.4: MambaPool.fork_from; 0.5.20's MambaRadixCache and the unified "
        "cache's Mamba component in 0.5.20 and 0.5.23: _alloc_mamba_slot): each such node keeps a whole free "
        "list alive (device memory growing with the tree)"
    )
    set_aside = "own_storage passes over a node's Mamba slot"
    tolerated = ("own_storage", "Mamba slot viewing a pool's free list")


class FinishedMambaSlotInt32(KnownFinding):
    name = "finished-mamba-slot-int32"
    releases = release_range("0.5.3.post2", "0.5.4.post3")
    check = "index_types"
    summary = (
        "cache_finished_req stores the request's Mamba slot as it reads it from the int32 request-to-Mamba map: "
        "tree nodes hold int32 and int64 Mamba slots side by side"
    )
    set_aside = "index_types passes over a node's Mamba slot"
    tolerated = ("index_types", "Mamba slot of dtype torch.int32")


class DisaggChunkedMambaFreed(KnownFinding):
    name = "disagg-chunked-mamba-freed"
    releases = release_range("0.5.3.post2", "0.5.5.post1")
    in_scheduler = True
    check = "meaning"
    summary = (
        "disaggregated prefill frees a chunked request's Mamba slot between chunks (req_to_token_pool.free "
        "without free_mamba_cache=False) while the request goes on using it: its next chunk resumes from a "
        "zeroed state, and the slot can be handed to another request"
    )
    set_aside = "disaggregated-prefill programs run without chunked prefill"

    def settings(self, scheduler: SchedulerConfig) -> SchedulerConfig:
        if scheduler.disaggregation_mode == "prefill":
            return replace(scheduler, chunked_prefill_size=None)
        return scheduler


class FlushUnderLiveRequests(KnownFinding):
    name = "flush-under-live-requests"
    releases = release_range("0.5.3.post2", "0.5.4.post1")
    in_scheduler = True
    check = "pool_conservation"
    summary = (
        "flush_cache checks only the waiting queue and the running batch, and resets the tree and clears both pools "
        "under the request being chunked, a prefill batch not yet merged, or requests whose KV is in transfer: "
        "their slots are handed out again while they use them"
    )
    set_aside = "no flush while any request is in the scheduler"

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        return op == "flush" and bool(driver.protocol.live_requests())


class RemovedNodesStayLinked(KnownFinding):
    name = "removed-nodes-stay-linked"
    releases = release_range("0.5.3.post2", "0.5.12.post1")
    check = "node_reclaimed"
    summary = (
        "a node taken out of an LRU list keeps its prev/next pointing at its old neighbours, so a removed node stays "
        "alive while a live node (a tombstone out of the Mamba list) still points at it, with whatever it points at "
        "in turn: evicted nodes, their KV and Mamba index tensors, are freed only by a full collection"
    )
    set_aside = "node_reclaimed passes over evicted nodes that only other nodes' links (LRU pointers, parent, children) reach"
    tolerated = ("node_reclaimed", "node links")


class ResetDropsLinkedTree(KnownFinding):
    name = "reset-drops-linked-tree"
    releases = release_range("0.5.3.post2", "0.5.23")
    check = "node_reclaimed"
    summary = (
        "reset() (a cache flush) replaces the root and the LRU lists but leaves the old tree's nodes referring to "
        "each other (parent, children, LRU pointers): the whole old tree, its index tensors included, is freed only "
        "by a full collection (MambaRadixCache in 0.5.4 and 0.5.20; UnifiedRadixCache's Python tree core in 0.5.20 "
        "and 0.5.23)"
    )
    set_aside = "node_reclaimed passes over nodes of a tree a reset dropped that only other nodes' links reach"
    tolerated = ("node_reclaimed", "a reset tree's links")


class RetractPassesIsInsert(KnownFinding):
    name = "retract-passes-is-insert"
    releases = release_range("0.5.3.post2", "0.5.4.post2")
    check = "TypeError"
    summary = (
        "retraction under decode memory pressure calls cache_finished_req(req, is_insert=False), which 0.5.4's "
        "MambaRadixCache does not accept: the scheduler dies with TypeError"
    )
    set_aside = "requests arrive only while all of them together (input and max_new_tokens) fit the KV pool"
    marks = ("is_insert",)

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        if op != "arrive":
            return False
        demand = sum(len(r.origin) + r.max_new_tokens for r in driver.protocol.live_requests())
        return demand + len(args["tokens"]) + args["max_new_tokens"] > driver.config.kv_size


class IdleCheckCountsWaitingSlot(KnownFinding):
    name = "idle-check-counts-waiting-slot"
    releases = release_range("0.5.4", "0.5.9")
    in_scheduler = True
    check = "ValueError"
    summary = (
        "a request the prefill budget refused keeps the Mamba slot its copy-on-write match filled; once the "
        "running batch drains the scheduler goes idle with it waiting, and the idle memory check counts the slot "
        "as leaked: ValueError, the scheduler dies"
    )
    set_aside = "the idle check counts Mamba slots held by waiting requests as in use"
    tolerated = ("idle check", "a waiting request's Mamba slot")
    marks = ("memory leak detected", "self_check_during_idle")


class IdleSanityCheckLruOrder(KnownFinding):
    name = "idle-sanity-check-lru-order"
    releases = release_range("0.5.3.post2", "0.5.4.post2")
    check = "Exception"
    summary = (
        "the idle sanity_check compares the LRU lists with the nodes' last_access_time stamps, which a match sets "
        "on the walked path (not the refreshed one, and 0.1 ms apart per level) and a split sets before the match: "
        "on reachable states it raises 'Incorrect LRU list' and the scheduler dies"
    )
    set_aside = "the idle check passes over sanity_check's 'Incorrect LRU list'"
    marks = ("Incorrect LRU list",)

    def tolerates(self, check: str, what: str) -> bool:
        return check == "idle check" and what.startswith("sanity_check:") and "Incorrect LRU list" in what


class AbortWaitingLeaksMambaSlot(KnownFinding):
    name = "abort-waiting-leaks-mamba-slot"
    releases = release_range("0.5.3.post2", "0.5.4.post3")
    in_scheduler = True
    check = "pool_conservation"
    summary = (
        "abort_request pops a waiting request from the queue and frees nothing: a Mamba slot its copy-on-write "
        "match filled (in an earlier round that refused it) is leaked for good"
    )
    set_aside = "no abort of a waiting request that holds a Mamba slot"

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        if op != "abort":
            return False
        protocol = driver.protocol
        req = next((r for r in protocol.live_requests() if r.rid == args["rid"]), None)
        return req in getattr(protocol, "waiting", ()) and driver.cut.mamba_slot_of(req.cut) is not None


class OverlapCheckpointOverwritten(KnownFinding):
    name = "overlap-checkpoint-overwritten"
    releases = release_range("0.5.18", "0.5.23")
    in_scheduler = True
    check = "meaning"
    summary = (
        "with the extra buffer under the overlap loop, a decode at a track boundary that directly follows an "
        "extend (a prompt of k * interval - 1 tokens) never flips the request's ping-pong index: its result is "
        "processed with a lookahead of one, the next batch's mask says no boundary, and the batch before it was "
        "an extend. The next boundary's checkpoint overwrites the slot holding the latest one, and a request "
        "finishing with that write in flight gives the tree the longer prefix's state under the shorter key "
        "(batch_result_processor._mamba_prefix_cache_update; 0.5.16 and 0.5.17, which read the lookahead into "
        "the committed length, are not affected): a later request resumes from the wrong state"
    )
    set_aside = ("with the extra buffer under the overlap loop, no prompt one token short of a track boundary "
                 "(a re-prefill after retraction or a last chunk can still reach it)")
    marks = ("Mamba state",)

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        config, interval = driver.config, driver.scheduler.mamba_track_interval
        if op != "arrive" or config.mamba_strategy != "extra_buffer" or config.event_loop != "overlap":
            return False
        return len(args["tokens"]) % interval == interval - 1


class OverlapLastBoundaryFlippedTwice(KnownFinding):
    name = "overlap-last-boundary-flipped-twice"
    releases = release_range("0.5.16", "0.5.17")
    in_scheduler = True
    check = "trees_equal"
    summary = (
        "with the extra buffer under the overlap loop, a request whose last decode step lands on a track boundary "
        "(its final length less one a multiple of the interval, by max_new_tokens or by sampling EOS there) flips "
        "its ping-pong index twice: the result of the decode before is processed with the boundary step launched "
        "(kv_committed_len counts it), and the boundary step's own result is processed with nothing launched after "
        "it, so kv_committed_len is the same boundary again (batch_result_processor._mamba_check_track_boundary; "
        "0.5.18 subtracts the lookahead). Finishing, the request gives the tree the other track slot, one the "
        "forward pass never wrote for it (a cleared slot, or another request's old state), under the boundary's key"
    )
    set_aside = ("no EOS sampled (requests end at their max_new_tokens), and with the extra buffer under the overlap "
                 "loop no request whose last decode lands on a track boundary (an abort can still reach it)")
    marks = ("node's Mamba slot",)

    def settings(self, scheduler: SchedulerConfig) -> SchedulerConfig:
        return replace(scheduler, eos_token_id=SchedulerConfig.eos_token_id)

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        config, interval = driver.config, driver.scheduler.mamba_track_interval
        if op != "arrive" or config.mamba_strategy != "extra_buffer" or config.event_loop != "overlap":
            return False
        last_decode = len(args["tokens"]) + args["max_new_tokens"] - 1
        return args["max_new_tokens"] > 1 and last_decode % interval == 0


KNOWN_FINDINGS: Dict[str, KnownFinding] = {
    f.name: f
    for f in (
        MambaForkViewsFreeList(),
        FinishedMambaSlotInt32(),
        DisaggChunkedMambaFreed(),
        FlushUnderLiveRequests(),
        RemovedNodesStayLinked(),
        ResetDropsLinkedTree(),
        RetractPassesIsInsert(),
        IdleCheckCountsWaitingSlot(),
        IdleSanityCheckLruOrder(),
        AbortWaitingLeaksMambaSlot(),
        OverlapCheckpointOverwritten(),
        OverlapLastBoundaryFlippedTwice(),
    )
}


class SetAside:
    """The known findings and failure signatures set aside in one run; the checks, the chooser,
    the draws and the engines consult it."""

    def __init__(self, findings: Iterable[KnownFinding] = (), every_release: bool = False,
                 signatures: Iterable[Signature] = ()):
        self.findings: List[KnownFinding] = list(findings)
        self.signatures: Dict[str, Signature] = {s.key: s for s in signatures}
        # set aside on whatever release runs, not only the ones each was found in (a trace
        # replayed across releases to learn which ones it fails on)
        self.every_release = every_release

    def __bool__(self) -> bool:
        return bool(self.findings or self.signatures)

    def tolerates(self, check: str, what: str) -> bool:
        """Whether a check that can go on past a failure (`TOLERABLE_CHECKS`) passes over it."""
        if any(f.tolerates(check, what) for f in self.findings):
            return True
        return check in TOLERABLE_CHECKS and Signature(INVARIANT, check, what).key in self.signatures

    def covers(self, signature: Signature) -> bool:
        """Whether a failure with `signature` is set aside: its program ends quietly."""
        return signature.key in self.signatures or any(f.matches(signature) for f in self.findings)

    def add_signature(self, signature: Signature) -> bool:
        """Set a failure's signature aside; False when it already was."""
        if signature.key in self.signatures:
            return False
        self.signatures[signature.key] = signature
        return True

    def avoids(self, op: str, args: Dict[str, Any], driver: Any) -> bool:
        return any(f.avoids(op, args, driver) for f in self.findings)

    def settings(self, scheduler: SchedulerConfig) -> SchedulerConfig:
        for f in self.findings:
            scheduler = f.settings(scheduler)
        return scheduler

    def names(self) -> List[str]:
        """What is set aside, as `--set-aside` takes it back: finding names, then signature keys."""
        return [f.name for f in self.findings] + list(self.signatures)

    def for_release(self, release: str, scheduler_release: Optional[str] = None) -> "SetAside":
        """Only the findings of `release` (a trace from one release replayed on another cache
        sets nothing aside there), and the scheduler's of `scheduler_release` when that
        release's scheduler drives the cache, unless they are set aside on every release; the
        signatures stay (they were found on the cache under test)."""
        if self.every_release:
            return self
        return SetAside((f for f in self.findings if _meets(f, release, scheduler_release)), signatures=self.signatures.values())


def _meets(finding: KnownFinding, release: str, scheduler_release: Optional[str]) -> bool:
    """Whether a run of code of `release`, driven by `scheduler_release`'s scheduler when that
    is another's, can meet `finding`: one of `release`, or a fault of that scheduler."""
    in_scheduler = finding.in_scheduler and scheduler_release is not None and finding.meets(scheduler_release)
    return finding.meets(release) or in_scheduler


def candidate_findings(signature: Signature, release: str) -> List[KnownFinding]:
    """The known findings of `release` a failure with `signature` may be (`KnownFinding.matches`)."""
    return [f for f in KNOWN_FINDINGS.values() if f.meets(release) and f.matches(signature)]



def is_signature_text(name: str) -> bool:
    return " | " in name


def set_aside(names: Sequence[str], release: str, scheduler_release: Optional[str] = None) -> SetAside:
    """What `--set-aside` names: known findings (`all`: every known finding of `release`, and of
    `scheduler_release`'s scheduler when that release's scheduler drives a cache of another:
    impl's tree inside it) and failure signatures (`check | what ...`, as a fuzz prints them; a
    trace file's is read by `harness.trace.set_aside_names`). ValueError naming an unknown
    finding, one not found in `release`, or a signature that does not parse."""
    chosen: List[KnownFinding] = []
    signatures: List[Signature] = []
    for name in names:
        if name == "all":
            chosen += [f for f in KNOWN_FINDINGS.values() if _meets(f, release, scheduler_release) and f not in chosen]
        elif is_signature_text(name):
            signatures.append(parse_key(name))
        else:
            finding = KNOWN_FINDINGS.get(name)
            if finding is None:
                raise ValueError(
                    f"--set-aside: unknown finding {name!r}; known: {sorted(KNOWN_FINDINGS)}, 'all', a trace file "
                    f"(.json) or a failure signature ('check | what ...')"
                )
            if not _meets(finding, release, scheduler_release):
                raise ValueError(f"--set-aside {name}: affects {finding.releases[0]} .. {finding.releases[-1]}, not the release under test ({release})")
            chosen.append(finding)
    return SetAside(chosen, signatures=signatures)

