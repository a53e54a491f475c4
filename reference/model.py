"""The executable specification of the hybrid radix cache: a dict from path to record.

A node is named by its *path*: `(extra_key, tokens)` with `tokens` every token from the root to
the node's end. Parent, children, segments and LRU order are all derived from the dict, never
stored. The pools are FIFO free lists, so the model predicts the exact slots every call hands
out; with paged KV, the layout of every slot it hands out (which free page is next is the
allocator's to pick). Each rule is marked with a `# rule:` line.

The model states the cache's contract, not any release's code: where SGLang 0.5.4 does otherwise
by mistake (a request finished with no output token caches one token too few and leaks its KV
slot; `cache_finished_req` refuses `is_insert`, which its own scheduler passes), the model does
the intended thing and the release fails. What releases changed on purpose is a named switch of
`Rules`. No code is shared with `impl/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Hashable, List, Optional, Sequence, Set, Tuple

Path = Tuple[Hashable, Tuple[int, ...]]
ROOT: Path = (None, ())


@dataclass(frozen=True)
class Rules:
    """The behaviours SGLang changed on purpose between releases, one named switch each."""

    name: str
    # a match moves the Mamba states of the whole matched path to MRU (else only the matched node's)
    match_refreshes_mamba_path: bool = True
    # insert moves the states it walks past, and an existing end state, to Mamba MRU (else only
    # states new to the tree enter the Mamba list)
    insert_refreshes_mamba: bool = True
    # a split moves the lower part's state to Mamba MRU (else the Mamba list is left as it was)
    split_refreshes_mamba: bool = True
    # an insert that ends on an existing node makes that node full MRU again, ahead of the lower
    # part of a split it just made
    insert_refreshes_end_node: bool = False
    # an insert that ends on an existing holder moves its state to Mamba MRU (with
    # `insert_refreshes_mamba` off; the states it walks past stay where they are)
    insert_refreshes_end_state: bool = False
    # only a node's KV decides whether it stays in the tree: a childless tombstone keeps its KV and
    # is a leaf like any other (eviction deletes no tombstone ancestors, and Mamba eviction of a
    # KV-locked childless holder tombstones it); else tombstones never end a path
    kv_decides_node_survival: bool = False
    # caching a running request matches its tokens again to find its new last node (refreshing
    # that path); else the node the insert ended on is taken as it is
    caching_rematches: bool = True
    # finishing a request (its final insert) matches its tokens again too, refreshing that path
    # (0.5.22's `checkpoint_into_tree`, one path for running and finished requests)
    finishing_rematches: bool = False
    # insert itself frees the caller's KV for tokens already cached past `prev_prefix_len` (else
    # the caller frees them)
    insert_frees_duplicate_kv: bool = False
    # the first Mamba / request slot (a release that reserves slot 0 as a padding target uses 1)
    first_mamba_slot: int = 0
    first_req_slot: int = 0
    # request slots are handed out from the tail of the free list (else from its head)
    req_slots_from_tail: bool = False
    # with the extra buffer, a finished request's KV past its tracked state's key is freed before
    # the insert (else after it, with the rest of what the request gives back)
    finishing_frees_past_key_first: bool = False


SGLANG_0_5_4 = Rules("0.5.4")
SGLANG_0_5_20 = Rules(
    "0.5.20",
    match_refreshes_mamba_path=False,
    insert_refreshes_mamba=False,
    split_refreshes_mamba=False,
    insert_refreshes_end_node=True,
    insert_frees_duplicate_kv=True,
    first_mamba_slot=1,
    first_req_slot=1,
    req_slots_from_tail=True,
)

# SGLang's UnifiedRadixCache (Full + Mamba components), the hybrid cache 0.5.20's scheduler
# builds and the only one from 0.5.21 on
SGLANG_UNIFIED = replace(
    SGLANG_0_5_20, name="unified", insert_refreshes_end_state=True, kv_decides_node_survival=True, caching_rematches=False
)

# 0.5.20's UnifiedRadixCache: caching a running request still matched its key again (0.5.23's
# `checkpoint` takes the node the insert ended on)
SGLANG_UNIFIED_0_5_20 = replace(SGLANG_UNIFIED, name="unified-0.5.20", caching_rematches=True)


class ModelMambaExhausted(Exception):
    """The model says: no Mamba slot even after evict_mamba (the cache cannot go on)."""


@dataclass
class Record:
    kv: Tuple[int, ...]  # KV slot of each token of this node's segment
    mamba: Optional[int]  # Mamba slot, None for a tombstone
    kv_lock: int = 0
    mamba_lock: int = 0
    full_tick: int = 0
    mamba_tick: int = 0


@dataclass
class ModelReq:
    """A request as the model sees it; `row` is its req_to_token row (KV slot per position)."""

    rid: int
    origin: Tuple[int, ...]
    extra_key: Hashable = None
    output: List[int] = field(default_factory=list)
    fill: Tuple[int, ...] = ()
    req_slot: Optional[int] = None
    mamba_slot: Optional[int] = None
    prefix: Tuple[int, ...] = ()
    last: Path = ROOT
    row: Dict[int, int] = field(default_factory=dict)
    # the extra buffer: the request's track slots (its ping-pong buffer), the length of the
    # state the forward pass last wrote into each since the request was last cached (None:
    # none), and which position it wrote last
    tracks: List[int] = field(default_factory=list)
    track_lens: List[Optional[int]] = field(default_factory=list)
    last_track: Optional[int] = None
    # the track slots it gave up (finished, aborted, retracted), which a batch launched before
    # (the overlap loop) may still checkpoint into
    released_tracks: Set[int] = field(default_factory=set)

    def drop_tracks(self) -> None:
        """The request holds no track slot any more (nor what it knew of their checkpoints)."""
        self.released_tracks.update(self.tracks)
        self.tracks, self.track_lens, self.last_track = [], [], None

    def kv_len(self) -> int:
        """rule: a request's computed tokens are its input and all but its last output token."""
        return len(self.origin) + max(len(self.output) - 1, 0)


def _lcp(a: Tuple[int, ...], b: Tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class ReferenceCache:
    """Model of the cache plus its three pools."""

    def __init__(
        self, kv_size: int, mamba_size: int, req_size: int, rules: Rules = SGLANG_0_5_4, tracking_slots: int = 0, page_size: int = 1
    ):
        self.rules = rules
        # the extra buffer (`extra_buffer` strategy): track slots per request beside its running
        # state, 0 without it
        self.tracking_slots = tracking_slots
        # KV slots per page: the unit the KV pool hands out and frees, and every key is cut to
        self.page_size = page_size
        self.nodes: Dict[Path, Record] = {}
        # rule: KV page 0 is padding, never free; the pool is `kv_size // page_size` pages after it
        self.kv_slots = range(page_size, page_size * (kv_size // page_size + 1))
        self.mamba_slots = range(rules.first_mamba_slot, rules.first_mamba_slot + mamba_size)
        self.req_slots = range(rules.first_req_slot, rules.first_req_slot + req_size)
        self.kv_free: List[int] = list(self.kv_slots)
        self.mamba_free: List[int] = list(self.mamba_slots)
        self.req_free: List[int] = list(self.req_slots)
        self.kv_group: Optional[List[int]] = None  # frees held back by an open free group
        self.page_group: Optional[List[int]] = None  # ... and its frees of whole pages by page id
        self.mamba_group: Optional[List[int]] = None  # Mamba slots an open allocation group holds
        self.clock = 0
        self.events: List[str] = []  # reach labels of the rules that fired, for the harness

    def note(self, label: str) -> None:
        self.events.append(label)

    # ----- derived structure ------------------------------------------------------------------

    def parent(self, path: Path) -> Path:
        """rule: a node's parent is the longest proper prefix that is a node (else the root)."""
        extra, tokens = path
        for cut in range(len(tokens) - 1, 0, -1):
            if (extra, tokens[:cut]) in self.nodes:
                return (extra, tokens[:cut])
        return ROOT

    def children(self, path: Path) -> List[Path]:
        return [p for p in self.nodes if self.parent(p) == path]

    def ancestors_and_self(self, path: Path) -> List[Path]:
        """`path` and every ancestor up to (excluding) the root, deepest first."""
        out = []
        while path != ROOT:
            out.append(path)
            path = self.parent(path)
        return out

    def is_leaf(self, path: Path) -> bool:
        return not self.children(path)

    def full_order(self) -> List[Path]:
        """rule: full LRU list = every node, most recently used first."""
        return sorted(self.nodes, key=lambda p: -self.nodes[p].full_tick)

    def mamba_order(self) -> List[Path]:
        """rule: Mamba LRU list = every Mamba holder, most recently used first."""
        holders = [p for p, r in self.nodes.items() if r.mamba is not None]
        return sorted(holders, key=lambda p: -self.nodes[p].mamba_tick)

    def kv_of(self, path: Path) -> Tuple[int, ...]:
        """KV slots of every token from the root to the end of `path`."""
        return tuple(s for p in reversed(self.ancestors_and_self(path)) for s in self.nodes[p].kv)

    def sizes(self) -> Tuple[int, int, int, int]:
        """rule: evictable = unlocked, protected = locked; KV counts tokens, Mamba counts states."""
        recs = self.nodes.values()
        return (
            sum(len(r.kv) for r in recs if r.kv_lock == 0),
            sum(len(r.kv) for r in recs if r.kv_lock > 0),
            sum(1 for r in recs if r.mamba is not None and r.mamba_lock == 0),
            sum(1 for r in recs if r.mamba is not None and r.mamba_lock > 0),
        )

    # ----- LRU bookkeeping --------------------------------------------------------------------

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _touch_full(self, path: Path) -> None:
        self.nodes[path].full_tick = self._tick()

    def _touch_mamba(self, path: Path) -> None:
        self.nodes[path].mamba_tick = self._tick()

    def _touch_path(self, path: Path) -> None:
        """rule: a matched node and its ancestors become MRU, the node ahead of its parents."""
        chain = list(reversed(self.ancestors_and_self(path)))
        for p in chain:
            self._touch_full(p)
        if not self.rules.match_refreshes_mamba_path:
            chain = chain[-1:]  # rule (0.5.20): only the matched node's state is used, so only it is refreshed
        for p in chain:
            if self.nodes[p].mamba is not None:  # rule: tombstones are not in the Mamba list
                self._touch_mamba(p)

    # ----- tree operations --------------------------------------------------------------------

    def _child_towards(self, at: Path, extra: Hashable, tokens: Tuple[int, ...]) -> Optional[Path]:
        """rule: the child of `at` whose segment starts with the key's next page (next token, at
        page size 1) is the shortest node extending `at` by that page (every other such node lies
        below it); none when the key has no whole page left."""
        depth = len(at[1]) + self.page_size
        if len(tokens) < depth:
            return None
        prefix = tokens[:depth]
        below = [p for p in self.nodes if p[0] == extra and p[1][:depth] == prefix]
        return min(below, key=lambda p: len(p[1])) if below else None

    def page_aligned(self, n: int) -> int:
        """rule: keys go in and match whole pages only: `n` tokens cut down to a page boundary."""
        return n // self.page_size * self.page_size

    def _common(self, a: Tuple[int, ...], b: Tuple[int, ...]) -> int:
        """rule: two keys share their common prefix's whole pages."""
        return self.page_aligned(_lcp(a, b))

    def _split(self, path: Path, keep: int) -> Path:
        """rule: cutting a node after `keep` tokens of its segment makes a tombstone upper part
        with the node's KV lock; the lower part keeps its path, Mamba state and locks."""
        self.note("node split")
        if self.page_size > 1:
            self.note("paged split")
        rec = self.nodes[path]
        upper = (path[0], path[1][: len(self.parent(path)[1]) + keep])
        self.nodes[upper] = Record(kv=rec.kv[:keep], mamba=None, kv_lock=rec.kv_lock)
        rec.kv = rec.kv[keep:]
        self._touch_full(upper)  # rule: upper inserted MRU, then the lower part ahead of it
        self._touch_full(path)
        if rec.mamba is not None and self.rules.split_refreshes_mamba:
            self._touch_mamba(path)  # rule (0.5.4): the lower part's state is re-inserted MRU
        return upper

    def match_prefix(self, tokens: Tuple[int, ...], extra: Hashable) -> Tuple[Tuple[int, ...], Path]:
        """rule: walk the key, splitting a partially matched node; answer the deepest Mamba
        holder on the walked path and its KV; refresh it and its ancestors."""
        if 0 < len(tokens) < self.page_size:
            self.note("sub-page prompt")
        tokens = tokens[: self.page_aligned(len(tokens))]
        if not tokens:
            return (), ROOT  # rule: a key of no whole page matches nothing and touches nothing
        at = ROOT
        while True:
            child = self._child_towards(at, extra, tokens) if len(at[1]) < len(tokens) else None
            if child is None:
                break
            common = self._common(child[1], tokens)
            if common < len(child[1]):
                at = self._split(child, common - len(at[1]))
                break
            at = child
        best = next((p for p in self.ancestors_and_self(at) if self.nodes[p].mamba is not None), ROOT)
        self._touch_path(best)
        return self.kv_of(best) if best != ROOT else (), best

    def insert(
        self, tokens: Tuple[int, ...], extra: Hashable, kv: Tuple[int, ...], mamba: int, prev_prefix_len: int = 0
    ) -> Tuple[int, bool]:
        """rule: walk the key refreshing each node (splitting where it diverges); add the rest
        as a new holder leaf, or make the end node a holder, or report that it already is one.
        The key goes in as far as its whole pages."""
        if self.page_size > 1 and len(tokens) % self.page_size and len(tokens) > self.page_size:
            self.note("key cut to whole pages")
        tokens, kv = tokens[: self.page_aligned(len(tokens))], kv[: self.page_aligned(len(tokens))]
        if not tokens:
            return 0, True  # rule: a key of no whole page inserts nothing and reports the state as present
        at = ROOT
        prefix_len = 0
        while len(at[1]) < len(tokens):
            child = self._child_towards(at, extra, tokens)
            if child is None:
                break
            self._touch_full(child)
            if self.nodes[child].mamba is not None and self.rules.insert_refreshes_mamba:
                self._touch_mamba(child)
            common = self._common(child[1], tokens)
            prefix_len += common - len(at[1])
            at = self._split(child, common - len(at[1])) if common < len(child[1]) else child
        if self.rules.insert_frees_duplicate_kv and prev_prefix_len < prefix_len:
            self.free_kv(kv[prev_prefix_len:prefix_len])  # rule (0.5.20): insert frees the caller's duplicate KV
        if len(at[1]) == len(tokens) and self.rules.insert_refreshes_end_node:
            self._touch_full(at)  # rule (0.5.20): an existing end node becomes full MRU again
        if len(at[1]) < len(tokens):
            path = (extra, tokens)
            self.nodes[path] = Record(kv=kv[len(at[1]):], mamba=mamba)
            self._touch_full(path)
            self._touch_mamba(path)
            return prefix_len, False
        rec = self.nodes[at]
        if rec.mamba is None:
            self.note("insert onto a tombstone")
            rec.mamba = mamba  # rule: inserting onto a tombstone makes it a holder again
            self._touch_mamba(at)
            return prefix_len, False
        if self.rules.insert_refreshes_mamba or self.rules.insert_refreshes_end_state:
            self._touch_mamba(at)  # rule (0.5.4, unified): the existing state is refreshed; caller keeps its own
        self.note("mamba_exist=True")
        return prefix_len, True

    def inc_lock(self, path: Path) -> None:
        """rule: lock KV on the node and every ancestor, Mamba on the node alone (if a holder)."""
        if path != ROOT and self.nodes[path].mamba is not None:
            self.nodes[path].mamba_lock += 1
        for p in self.ancestors_and_self(path):
            self.nodes[p].kv_lock += 1

    def can_dec_lock(self, path: Path) -> bool:
        """rule: unlocking needs a Mamba lock on a holder and a KV lock all the way up."""
        if path == ROOT:
            return True
        rec = self.nodes[path]
        if rec.mamba is not None and rec.mamba_lock <= 0:
            return False
        return all(self.nodes[p].kv_lock > 0 for p in self.ancestors_and_self(path))

    def dec_lock(self, path: Path) -> None:
        """rule: undo one inc_lock; refused (and nothing changes) when not locked."""
        if not self.can_dec_lock(path):
            raise ValueError(f"dec_lock on unlocked path {path}")
        if path != ROOT and self.nodes[path].mamba is not None:
            self.nodes[path].mamba_lock -= 1
        for p in self.ancestors_and_self(path):
            self.nodes[p].kv_lock -= 1

    def reset(self) -> None:
        """rule: a flush forgets the whole tree (the pools are cleared by their own calls)."""
        self.nodes = {}

    # ----- eviction (the seed's walks, literally) ---------------------------------------------

    def _next_in_full(self, after_tick: int, want) -> Optional[Path]:
        """The least recent node newer than `after_tick` (any node if -1) satisfying `want`."""
        for p in reversed(self.full_order()):
            if self.nodes[p].full_tick > after_tick and want(p):
                return p
        return None

    def _next_in_mamba(self, after_tick: int) -> Optional[Path]:
        for p in reversed(self.mamba_order()):
            if self.nodes[p].mamba_tick > after_tick and self.nodes[p].mamba_lock == 0:
                return p
        return None

    def _unlocked_leaf(self, p: Path) -> bool:
        return self.nodes[p].kv_lock == 0 and self.is_leaf(p)

    def _evict_leaf(self, path: Path) -> Tuple[int, Path]:
        """rule: an evicted leaf frees its KV and state, then every tombstone ancestor it leaves
        as an unlocked leaf goes too. Returns KV tokens freed and the last node deleted."""
        rec = self.nodes[path]
        assert rec.kv_lock == 0 and rec.mamba_lock == 0
        assert rec.mamba is not None or self.rules.kv_decides_node_survival
        self.free_kv(rec.kv)
        if rec.mamba is not None:
            self.free_mamba([rec.mamba])
        freed = len(rec.kv)
        del self.nodes[path]
        last = path
        parent = self.parent(path)
        if self.rules.kv_decides_node_survival:
            return freed, last  # rule (unified): a tombstone left childless stays, a leaf itself
        while parent != ROOT and self.nodes[parent].mamba is None and self.is_leaf(parent) and self.nodes[parent].kv_lock == 0:
            self.note("cascade deletion of a tombstone ancestor")
            self.free_kv(self.nodes[parent].kv)
            freed += len(self.nodes[parent].kv)
            grand = self.parent(parent)
            del self.nodes[parent]
            last, parent = parent, grand
        return freed, last

    def evict(self, num_tokens: int) -> None:
        """rule: free LRU unlocked leaves (with their tombstone ancestors) until enough tokens;
        after a deletion leaves the parent childless, restart from the LRU end."""
        if num_tokens <= 0:
            return
        freed = 0
        x = self._next_in_full(-1, self._unlocked_leaf)
        while freed < num_tokens and x is not None:
            x_next = self._next_in_full(self.nodes[x].full_tick, self._unlocked_leaf)
            got, last = self._evict_leaf(x)
            freed += got
            parent = self.parent(last)
            if not self.children(parent):
                x_next = self._next_in_full(-1, self._unlocked_leaf)
            x = x_next

    def evict_mamba(self, num: int) -> None:
        """rule: take the LRU holder whose state is unlocked: tombstone it if internal, evict it
        if a leaf; repeat until `num` states are freed."""
        if num <= 0:
            return
        freed = 0
        x = self._next_in_mamba(-1)
        while freed < num and x is not None:
            x_next = self._next_in_mamba(self.nodes[x].mamba_tick)
            kv_locked_leaf = self.nodes[x].kv_lock > 0 and self.rules.kv_decides_node_survival
            if self.children(x) or kv_locked_leaf:
                self.note("Mamba evicted from a KV-locked leaf (tombstoned)" if kv_locked_leaf and not self.children(x)
                          else "Mamba evicted from an internal node (tombstoned)")
                self.free_mamba([self.nodes[x].mamba])
                self.nodes[x].mamba = None
            else:
                self._evict_leaf(x)
            freed += 1
            x = x_next

    # ----- pools ------------------------------------------------------------------------------

    @staticmethod
    def _take(free: List[int], n: int) -> Optional[List[int]]:
        """rule: a pool hands out the head of its free list, or nothing (and no change) when short."""
        if n > len(free):
            return None
        out = free[:n]
        del free[:n]
        return out

    def kv_alloc(self, n: int, chosen: Optional[Sequence[int]] = None) -> Optional[List[int]]:
        """rule: `n` slots off the head of the free list; paged, `n // page_size` whole pages,
        the head's or the free pages `chosen`."""
        if self.page_size == 1:
            return self._take(self.kv_free, n)
        return self._take_pages(n // self.page_size, chosen)

    def _page_slots(self, pages: Sequence[int]) -> List[int]:
        return [page * self.page_size + i for page in pages for i in range(self.page_size)]

    def _take_pages(self, n: int, chosen: Optional[Sequence[int]]) -> Optional[List[int]]:
        """`n` pages off the free list: the head's, or the `chosen` ones (None unless all are
        free and there are `n`)."""
        if chosen is None:
            return self._take(self.kv_free, n * self.page_size)
        free = set(self.kv_free)
        slots = self._page_slots(chosen)
        if len(chosen) != n or len(set(chosen)) != n or not free.issuperset(slots):
            return None
        taken = set(slots)
        self.kv_free = [s for s in self.kv_free if s not in taken]
        return slots

    def kv_alloc_extend(
        self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int], chosen: Optional[Sequence[int]] = None
    ) -> Optional[List[int]]:
        """rule (paged): each request of a batch extends from `prefix_len` to `seq_len` tokens,
        first into the rest of its last page (after the slot `last_loc`), then into new pages,
        whole pages from their first slot, the batch's requests in order: off the head of the free
        list, or the free pages `chosen` (which free page is the allocator's to pick); nothing
        (and no change) when the new pages are more than the free ones."""
        ps = self.page_size
        need = [-(-seq // ps) - -(-prefix // ps) for prefix, seq in zip(prefix_lens, seq_lens)]
        if sum(need) * ps > len(self.kv_free):
            return None
        fresh = self._take_pages(sum(need), chosen)
        if fresh is None:
            return None
        out: List[int] = []
        for prefix, seq, last, pages in zip(prefix_lens, seq_lens, last_locs, need):
            in_last_page = min(seq, -(-prefix // ps) * ps) - prefix
            if in_last_page:
                self.note("extend into a partial page")
            out.extend(range(last + 1, last + 1 + in_last_page))
            mine, fresh = fresh[: pages * ps], fresh[pages * ps :]
            out.extend(mine[: seq - prefix - in_last_page])
        return out

    def kv_alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int], chosen: Optional[Sequence[int]] = None) -> Optional[List[int]]:
        """rule (paged): each request of a decode batch takes the slot after `last_loc`, or the
        first slot of a new page when its new token starts one (off the head of the free list,
        or the free pages `chosen`, in the batch's order); nothing (and no change) when those
        pages are more than the free ones."""
        ps = self.page_size
        starts = [(seq - 1) % ps == 0 for seq in seq_lens]
        if sum(starts) * ps > len(self.kv_free):
            return None
        fresh = self._take_pages(sum(starts), chosen)
        if fresh is None:
            return None
        if any(starts):
            self.note("decode starts a page")
        firsts = iter(fresh[::ps])
        return [next(firsts) if start else last + 1 for start, last in zip(starts, last_locs)]

    def free_kv(self, slots: Sequence[int]) -> None:
        """rule: freed slots go to the tail; paged, the pages they lie on go to the head, each
        once, in the order of the slots (a row's pages in the row's order; the whole page,
        whoever else holds a slot of it); inside a free group, when the group ends."""
        if self.kv_group is not None:
            self.kv_group.extend(slots)
        elif self.page_size == 1:
            self.kv_free.extend(slots)
        elif slots:
            self.free_pages(list(dict.fromkeys(s // self.page_size for s in slots)))

    def free_pages(self, pages: Sequence[int]) -> None:
        """rule (paged): pages freed by id go to the head as given; inside a free group, when
        the group ends (after its freed slots' pages)."""
        if self.page_size == 1:
            self.free_kv(pages)  # rule: page ids are slot ids
        elif self.page_group is not None:
            self.page_group.extend(pages)
        else:
            self.kv_free[:0] = self._page_slots(pages)

    def free_group_begin(self) -> None:
        self.kv_group = []
        self.page_group = []

    def free_group_end(self) -> None:
        group, self.kv_group = self.kv_group or [], None
        pages, self.page_group = self.page_group or [], None
        self.free_kv(group)
        if pages:
            self.free_pages(pages)

    def kv_clear(self) -> None:
        """rule: a cleared KV pool has every slot free, in order."""
        self.kv_free = list(self.kv_slots)
        self.kv_group = self.page_group = None

    def mamba_alloc(self, n: int) -> Optional[List[int]]:
        """rule: a single slot comes from the open allocation group first, while it lasts."""
        if n == 1 and self.mamba_group:
            return [self.mamba_group.pop(0)]
        return self._take(self.mamba_free, n)

    def mamba_alloc_group_begin(self, n: int) -> None:
        """rule (unified 0.5.23): a scheduling pass takes `n` slots off the head at once for the
        requests it may admit (none when fewer are free)."""
        self.mamba_group = self._take(self.mamba_free, n) if n > 0 else None

    def mamba_alloc_group_end(self) -> None:
        """rule: the group's unused slots go back to the tail, in order."""
        rest, self.mamba_group = self.mamba_group or [], None
        self.free_mamba(rest)

    def free_mamba(self, slots: Sequence[int]) -> None:
        self.mamba_free.extend(slots)

    def req_alloc(self, reqs: Sequence[ModelReq]) -> Optional[List[int]]:
        """rule: one request slot each (a request that holds one keeps it), plus a Mamba slot for
        each request without one, then its track slots (extra buffer) if it has none; all or
        nothing."""
        need = sum((r.mamba_slot is None) + (0 if r.tracks else self.tracking_slots) for r in reqs)
        fresh = [r for r in reqs if r.req_slot is None]
        if len(fresh) > len(self.req_free) or need > len(self.mamba_free) + len(self.mamba_group or ()):
            return None
        for r in reqs:
            if r.mamba_slot is None:
                r.mamba_slot = self.mamba_alloc(1)[0]
            if self.tracking_slots and not r.tracks:
                r.tracks = self.mamba_alloc(self.tracking_slots)
                r.track_lens, r.last_track = [None] * self.tracking_slots, None
        n = len(fresh)
        if self.rules.req_slots_from_tail:
            slots = self.req_free[len(self.req_free) - n :]
            del self.req_free[len(self.req_free) - n :]
        else:
            slots, self.req_free = self.req_free[:n], self.req_free[n:]
        for r, slot in zip(fresh, slots):
            r.req_slot = slot
            r.row = {}
        return [r.req_slot for r in reqs]

    def req_free_slot(self, req: ModelReq, free_mamba: bool = True) -> None:
        """rule: a request slot goes back to the tail; with it, unless told otherwise, the
        request's Mamba slot. The pool frees by index: what the request's own fields say is the
        scheduler's to reset."""
        self.req_free.append(req.req_slot)
        if free_mamba:
            self.free_mamba([req.mamba_slot])
        req.req_slot = None
        req.row = {}

    def free_request_states(self, req: ModelReq, keep: Optional[int] = None) -> None:
        """rule: a request done with its states frees its running slot, then its track slots
        in order (but the one at position `keep`, which the tree took)."""
        self.free_mamba([req.mamba_slot])
        self.free_mamba([slot for pos, slot in enumerate(req.tracks) if pos != keep])
        req.mamba_slot = None
        req.drop_tracks()

    def req_pool_clear(self) -> None:
        """rule: a cleared request pool has every request and Mamba slot free, in order."""
        self.req_free = list(self.req_slots)
        self.mamba_free = list(self.mamba_slots)

    # ----- request-level calls ----------------------------------------------------------------

    def match_for_request(self, req: ModelReq, key: Tuple[int, ...], cow: bool) -> Tuple[Tuple[int, ...], Path]:
        """rule: match; with cow, copy the matched state into the request's own Mamba slot,
        allocating one (evicting one state, the matched node protected) if it has none."""
        kv, last = self.match_prefix(key, req.extra_key)
        if cow and last != ROOT:
            self.note("cow into a new slot" if req.mamba_slot is None else "cow into an existing slot")
            if req.mamba_slot is None:
                got = self.mamba_alloc(1)
                if got is None:
                    self.note("cow into a full Mamba pool: evicted a state")
                    self.inc_lock(last)
                    self.evict_mamba(1)
                    got = self.mamba_alloc(1)
                    self.dec_lock(last)
                    if got is None:
                        raise ModelMambaExhausted()
                req.mamba_slot = got[0]
        return kv, last

    def _row(self, req: ModelReq, n: int) -> Tuple[int, ...]:
        missing = [i for i in range(n) if i not in req.row]
        if missing:
            raise ValueError(f"request {req.rid}'s row holds no KV slot at position(s) {missing}")
        return tuple(req.row[i] for i in range(n))

    # ----- the extra buffer ---------------------------------------------------------------------

    def record_track(self, req: ModelReq, slot: int, length: int) -> None:
        """The forward pass wrote the state of the request's first `length` tokens into its track
        slot `slot` (ValueError for a slot it does not hold). rule: a checkpoint into a slot the
        request has released since the batch was launched (the overlap loop processes a batch's
        results after it launches the next) is no one's."""
        if slot not in req.tracks and slot in req.released_tracks:
            self.note("checkpoint after release")
            return
        if slot not in req.tracks:
            raise ValueError(f"request {req.rid} holds track slots {req.tracks}, not {slot}")
        pos = req.tracks.index(slot)
        req.track_lens[pos], req.last_track = length, pos
        self.note("track boundary crossed")

    def _tracked_state(self, req: ModelReq, n: int) -> Optional[Tuple[int, int]]:
        """rule (extra buffer): the state the tree may take for the request's first `n` tokens:
        (track position, length) of the one written last, if no longer than `n`, else of the
        other (ping-pong) if that one is; None when neither is."""
        if req.last_track is None:
            return None
        for pos in (req.last_track, 1 - req.last_track) if len(req.tracks) == 2 else (req.last_track,):
            length = req.track_lens[pos]
            if length is not None and 0 < length <= n:
                return pos, length
        return None

    def _fresh_slot(self) -> int:
        """rule: one Mamba slot, a state evicted for it when none is free."""
        got = self.mamba_alloc(1)
        if got is None:
            self.evict_mamba(1)
            got = self.mamba_alloc(1)
            if got is None:
                raise ModelMambaExhausted()
        return got[0]

    # ----- request-level calls ----------------------------------------------------------------

    def cache_unfinished_req(self, req: ModelReq) -> None:
        """rule: insert fill with the request's KV and a fork of its state; free the request's
        duplicate KV (and the fork if a state existed); re-match and move the lock there.
        With the extra buffer the tree takes the request's tracked state instead (the key cut
        to its length; a fresh slot takes its place in the track buffer) or, with none, nothing;
        either way the request's tracked lengths are forgotten."""
        if self.tracking_slots:
            picked = self._tracked_state(req, len(req.fill))
            req.track_lens = [None] * len(req.tracks)
            if picked is None:
                return
            pos, length = picked
            state = req.tracks[pos]
            req.tracks[pos] = self._fresh_slot()
            self.note("slot donated")
            tokens = req.fill[:length]
        else:
            tokens = req.fill
            state = self._fresh_slot()
        kv = self._row(req, len(tokens))
        splits = self.events.count("node split")
        new_prefix_len, exist = self.insert(tokens, req.extra_key, kv, state, len(req.prefix))
        if self.events.count("node split") > splits:
            self.note("a running request's insert split a node")
        if not self.rules.insert_frees_duplicate_kv:
            self.free_kv(kv[len(req.prefix):new_prefix_len])
        if exist:
            self.free_mamba([state])
        if self.rules.caching_rematches:
            new_kv, new_last = self.match_prefix(tokens, req.extra_key)
        else:
            new_last = (req.extra_key, tokens)  # rule (unified): the lock moves to the insert's end node
            new_kv = self.kv_of(new_last)
        for i in range(len(req.prefix), len(new_kv)):
            req.row[i] = new_kv[i]
        self.dec_lock(req.last)
        self.inc_lock(new_last)
        req.prefix, req.last = new_kv, new_last

    def cache_finished_req(self, req: ModelReq, is_insert: bool = True, length: Optional[int] = None) -> None:
        """rule: the request's computed tokens (`kv_len`, or the first `length` when its caller
        knows how far the forward pass went) go in with their KV and the request's own state;
        the duplicate KV, the request slot, and the state if one already existed are freed, and
        the lock released. With `is_insert=False` (a retracted or failed request) nothing goes
        in: all the request's own KV, its request slot and its state are freed."""
        n = req.kv_len() if length is None else length
        kv = self._row(req, n)
        if self.tracking_slots:
            return self._cache_finished_tracked(req, is_insert, kv)
        if not is_insert:
            self.free_kv(kv[len(req.prefix):])
            self.req_free_slot(req, free_mamba=True)
            self.dec_lock(req.last)
            return
        tokens = (req.origin + tuple(req.output))[:n]
        new_prefix_len, exist = self.insert(tokens, req.extra_key, kv, req.mamba_slot, len(req.prefix))
        if self.rules.finishing_rematches:
            self.match_prefix(tokens, req.extra_key)
        if not self.rules.insert_frees_duplicate_kv:
            self.free_kv(kv[len(req.prefix):new_prefix_len])
        self.req_free_slot(req, free_mamba=exist)
        self.dec_lock(req.last)

    def _cache_finished_tracked(self, req: ModelReq, is_insert: bool, kv: Tuple[int, ...]) -> None:
        """rule (extra buffer): a finished request's tokens go in only as far as its tracked
        state (`_tracked_state`), which the tree takes; its KV past the key, its running slot,
        its other track slots (all of them if the state existed or none went in) and its
        request slot are freed, and its lock released."""
        picked = self._tracked_state(req, len(kv)) if is_insert else None
        keep = None
        if picked is None:
            self.note("finished with no tracked state" if is_insert else "released without caching")
            self.free_kv(kv[len(req.prefix):])
        else:
            pos, length = picked
            tokens = (req.origin + tuple(req.output))[:length]
            past_key = kv[max(length, len(req.prefix)):]
            if self.rules.finishing_frees_past_key_first:
                self.free_kv(past_key)  # rule (unified 0.5.16): the tail goes before the insert
            new_prefix_len, exist = self.insert(tokens, req.extra_key, kv[:length], req.tracks[pos], len(req.prefix))
            if self.rules.finishing_rematches:
                self.match_prefix(tokens, req.extra_key)
            if not self.rules.insert_frees_duplicate_kv:
                self.free_kv(kv[len(req.prefix):new_prefix_len])
            if not self.rules.finishing_frees_past_key_first:
                self.free_kv(past_key)
            keep = None if exist else pos
        self.free_request_states(req, keep)
        self.req_free_slot(req, free_mamba=False)
        self.dec_lock(req.last)
