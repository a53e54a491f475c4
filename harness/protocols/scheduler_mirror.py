"""`ModelMirror`: every call the release's own scheduler makes on the cache under test's tree and
pools, made on the reference model too, the answers compared (`Divergence` at the first
disagreement), so that `--protocol scheduler` runs every check a hand-written protocol runs.

The scheduler calls the cache and the pools it was built with; the mirror wraps their methods on
those instances (and `mem_cache/common.release_kv_cache` and `Req.reset_for_retract` where the
scheduler's modules name them). A call made inside another mirrored call is that call's own
business (the tree's insert frees KV through the allocator; the model's twin of the outer call
does the same): only the outermost call is mirrored.

  tree_cache.match_prefix(params)     model.match_prefix, or match_for_request for a request
                                      (with cow_mamba, its Mamba slot as the model allocates it)
  tree_cache.touch_prefix(key)        model.match_prefix (a walk that refreshes the path)
  tree_cache.lock(node) / unlock(l)   model.inc_lock / dec_lock of the node's path
  tree_cache.checkpoint(req, up_to)   model.cache_unfinished_req with the fill ids up to up_to
  tree_cache.evict / evict_for_alloc  model.evict(num_tokens), model.evict_mamba(mamba_num)
  tree_cache.reset()                  model.reset
  release_kv_cache(req, tree_cache)   model.cache_finished_req (is_insert = checkpoint), the
                                      request's length the positions the stand-in forward pass
                                      computed for it (never SGLang's own count)
  Req.reset_for_retract()             the twin forgets its prefix, node and Mamba slot
  allocator alloc/free/free groups/clear, the Mamba allocator's alloc/free/allocation groups,
  (paged) alloc_extend/alloc_decode/free_segment/free_page_ids
  the request pool's alloc(reqs)/free(req)/clear     the model's pool calls

Each SGLang `Req` has a `ModelReq` twin, made at its first mirrored call. What a request's row
holds is what SGLang wrote (the model is told, as a hand-written protocol tells it through
`PairedCaches.write_row`); its tokens are its input and the outputs the program sampled.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple

from harness.pairing import Divergence, PairedCaches
from reference import ROOT, ModelMambaExhausted, ModelReq

Twin = Callable[..., Generator[None, Any, None]]


class ModelMirror:
    """The model's twin of every call the scheduler over `runtime` makes (see the module
    docstring); `attach` points it at one program's paired caches."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.cut = runtime.cut
        self.caches: Optional[PairedCaches] = None
        self.depth = 0  # > 0 inside a mirrored call: the calls it makes are its own
        self.twins: Dict[str, ModelReq] = {}
        # id(receipt) -> (the receipt, weakly: a lock released inside another call is never
        # seen released, and the mirror must not keep its node alive; the model's path)
        self.locks: Dict[int, Tuple[weakref.ref, Any]] = {}
        self._install()
        runtime.on_track = self.record_track

    def attach(self, caches: Optional[PairedCaches]) -> None:
        """Mirror into `caches.model` from now on (a new program: no twins, no locks yet); with
        None, mirror nothing (between programs)."""
        self.caches = caches
        self.twins.clear()
        self.locks.clear()

    # ----- installing the wrappers ------------------------------------------------------------

    def tree_calls(self) -> Tuple[Tuple[str, Twin], ...]:
        """The tree's methods the scheduler calls, each with its twin."""
        shared = (("match_prefix", self._match_prefix), ("evict", self._evict), ("evict_for_alloc", self._evict), ("reset", self._reset))
        return shared + self.request_calls()

    def request_calls(self) -> Tuple[Tuple[str, Twin], ...]:
        """The calls that walk, lock and cache a request's path, with their twins (0.5.22 on)."""
        return (
            ("touch_prefix", self._touch_prefix),
            ("lock", self._lock),
            ("unlock", self._unlock),
            ("checkpoint", self._checkpoint),
        )

    def _install(self) -> None:
        cut = self.cut
        tree, kv, mamba, req_pool = cut.cache, cut.kv, cut.mamba_slots, cut.req_pool
        for obj, name, twin in (
            *((tree, name, twin) for name, twin in self.tree_calls()),
            (kv, "alloc", self._kv_alloc),
            *((kv, name, twin) for name, twin in self.paged_calls() if hasattr(kv, name)),
            (kv, "free", self._kv_free),
            (kv, "free_group_begin", self._free_group_begin),
            (kv, "free_group_end", self._free_group_end),
            (kv, "clear", self._kv_clear),
            (mamba, "alloc", self._mamba_alloc),
            (mamba, "alloc_group_begin", self._mamba_group_begin),
            (mamba, "alloc_group_end", self._mamba_group_end),
            (mamba, "free", self._mamba_free),
            (req_pool, "alloc", self._req_alloc),
            (req_pool, "free", self._req_free),
            (req_pool, "clear", self._req_pool_clear),
        ):
            setattr(obj, name, self._mirrored(f"{_role(obj, cut)}.{name}", getattr(obj, name), twin))
        _install_module_hooks()
        self.release_kv_cache = self._mirrored("release_kv_cache", _ORIGINALS["release_kv_cache"], self._release)
        _MIRRORS.clear()  # one scheduler at a time (`Runtimes`): the last one's mirror is done
        _MIRRORS[id(tree)] = self

    def _mirrored(self, call: str, original: Callable, twin: Twin) -> Callable:
        """`original`, and then (unless inside another mirrored call, or with no program
        attached) the rest of `twin`, which ran up to its first `yield` before the call and is
        sent the call's result."""

        def mirrored(*args: Any, **kwargs: Any) -> Any:
            if self.depth or self.caches is None:
                return original(*args, **kwargs)
            self.caches.calls.append(call)
            steps = twin(*args, **kwargs)
            next(steps)
            self.depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                self.depth -= 1
            try:
                steps.send(result)
            except StopIteration:
                pass
            except Exception as exc:
                if getattr(exc, "sglang_call", None) is None:
                    exc.sglang_call = call
                raise
            self.caches.flush_events()
            return result

        mirrored.__wrapped__ = original
        return mirrored

    # ----- requests ---------------------------------------------------------------------------

    def twin(self, req: Any) -> ModelReq:
        """The request's model twin, its outputs and row as they are now."""
        mreq = self.twins.get(req.rid)
        if mreq is None:
            mreq = self.twins[req.rid] = ModelReq(rid=int(req.rid), origin=tuple(req.origin_input_ids), extra_key=req.extra_key)
        mreq.output = list(req.output_ids)
        slot, allocated = self.cut.req_slot_of(req), self.cut.allocated_len_of(req)
        if slot is not None and allocated:
            row = self.cut.req_pool.req_to_token[slot, :allocated].tolist()
            mreq.row = dict(enumerate(row))
        return mreq

    def path(self, node: Any) -> Any:
        """The model's path of a tree node (an id): its path from the root, or, for a tree whose
        nodes cannot be read, the model's node holding the same KV slots from the root."""
        if node == self.cut.root_handle():
            return ROOT
        if not self.cut.opaque:
            return self.cut.path_of(node)
        kv = self.cut.node_kv(node)
        return next((p for p in self.caches.model.nodes if self.caches.model.kv_of(p) == kv), ("<not in the model>", kv))

    def _agree_mamba_slot(self, call: str, req: Any, mreq: ModelReq) -> None:
        self.caches.agree(call, f"request {req.rid}'s Mamba slot", self.cut.mamba_slot_of(req), mreq.mamba_slot)
        self.caches.agree(call, f"request {req.rid}'s track slots", self.cut.track_slots_of(req), mreq.tracks)

    def record_track(self, req: Any, slot: int, length: int) -> None:
        """The forward pass checkpointed the request's first `length` tokens into track slot
        `slot` (the extra buffer): the model's twin is told, as it is told what a row holds."""
        if self.caches is None:
            return
        try:
            self.caches.model.record_track(self.twin(req), slot, length)
        except ValueError as exc:
            raise Divergence(f"forward pass of request {req.rid}", "the track slot it checkpoints into", f"slot {slot}", str(exc)) from None
        self.caches.flush_events()

    # ----- the tree's calls -------------------------------------------------------------------

    def _match_prefix(self, params: Any) -> Generator[None, Any, None]:
        tokens, extra, req = _key_tokens(params.key), params.key.extra_key, params.req
        call = f"match_prefix(key={list(tokens)}, cow_mamba={params.cow_mamba})" + ("" if req is None else f" for request {req.rid}")
        mreq = None if req is None else self.twin(req)
        result = yield
        model = self.caches.model
        if mreq is None:
            kv, last = model.match_prefix(tokens, extra)
        else:
            try:
                kv, last = model.match_for_request(mreq, tokens, params.cow_mamba)
            except ModelMambaExhausted:
                raise Divergence(call, "running out of Mamba slots", "a slot", "none left") from None
            mreq.prefix, mreq.last = kv, last
        node = result.last_device_node
        got = tuple(self.cut.node_kv(node)[: self.matched_len(result)])
        self.caches.agree(call, "matched KV slots", got, kv)
        self.caches.agree(call, "last node", self.path(node), last)
        if mreq is not None:
            self._agree_mamba_slot(call, req, mreq)

    @staticmethod
    def matched_len(result: Any) -> int:
        """How many tokens a `MatchResult` matched on the device."""
        return result.device_prefix_len

    def _touch_prefix(self, key: Any) -> Generator[None, Any, None]:
        yield
        self.caches.model.match_prefix(_key_tokens(key), key.extra_key)

    def _lock(self, node: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        path = self.path(node)
        receipt = yield
        if receipt is not None:
            self.caches.model.inc_lock(path)
            self.locks[id(receipt)] = (weakref.ref(receipt), path)

    def _unlock(self, receipt: Any) -> Generator[None, Any, None]:
        if receipt is None:
            yield
            return
        held = self.locks.pop(id(receipt), None)
        yield
        if held is None or held[0]() is not receipt:
            raise Divergence("unlock(lock)", "the lock released", f"a lock on node {receipt.node} the mirror never saw taken", "a lock taken")
        try:
            self.caches.model.dec_lock(held[1])
        except ValueError as exc:
            raise Divergence("unlock(lock)", "the lock released", f"released node {receipt.node}", str(exc)) from None

    def _checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> Generator[None, Any, None]:
        fill = (tuple(req.origin_input_ids) + tuple(req.output_ids))[:up_to]
        return self._cached(req, f"checkpoint(req {req.rid}, up_to={up_to})", fill)

    def _cached(self, req: Any, call: str, fill: Tuple[int, ...]) -> Generator[None, Any, None]:
        """The twin of caching a running request's first tokens, `fill` (`call`)."""
        mreq = self.twin(req)
        mreq.fill = fill
        yield
        try:
            self.caches.model.cache_unfinished_req(mreq)
        except ModelMambaExhausted:
            raise Divergence(call, "running out of Mamba slots", "a slot", "none left") from None
        self.caches.agree(call, "the request's last node after caching", self.path(req.last_node), mreq.last)
        self.caches.agree(call, "the tree's share of the request's row", self.cut.protected_len_of(req), len(mreq.prefix))

    def _evict(self, params: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        yield
        self.caches.model.evict(params.num_tokens)
        self.caches.model.evict_mamba(params.mamba_num or 0)

    def _reset(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.reset()
        self.locks.clear()

    def _release(self, req: Any, tree_cache: Any, *, checkpoint: bool) -> Generator[None, Any, None]:
        """`release_kv_cache(req, tree_cache, checkpoint=...)`: the request leaves the tree's
        care, what it computed going in with `checkpoint`."""
        return self._released(req, f"release_kv_cache(req {req.rid}, checkpoint={checkpoint})", checkpoint)

    def _released(self, req: Any, call: str, insert: bool) -> Generator[None, Any, None]:
        """The twin of a release of `req` (`call`), what it computed going into the tree with
        `insert` (unless the request is barred from the tree)."""
        mreq = self.twin(req)
        holds_kv, holds_mamba = self.cut.req_slot_of(req) is not None, self.cut.mamba_slot_of(req) is not None
        is_insert = insert and not req.skip_radix_cache_insert
        computed = self.runtime.computed_len(req)
        yield
        model = self.caches.model
        if not holds_kv:
            if holds_mamba:
                model.free_mamba([mreq.mamba_slot])
                mreq.mamba_slot = None
            return
        try:
            model.cache_finished_req(mreq, is_insert=is_insert, length=computed)
        except ValueError as exc:
            raise Divergence(call, "what the request releases", "released", str(exc)) from None
        self.caches.agree(call, f"request {req.rid}'s request slot", self.cut.req_slot_of(req), mreq.req_slot)

    def reset_for_retract(self, req: Any) -> None:
        """`Req.reset_for_retract`: the twin has no prefix, node or Mamba slot any more."""
        mreq = self.twins.get(req.rid)
        if mreq is not None:
            mreq.prefix, mreq.last, mreq.mamba_slot = (), ROOT, None
            mreq.drop_tracks()

    # ----- the pools' calls -------------------------------------------------------------------

    def _chosen_pages(self, got: Any) -> Optional[List[int]]:
        """Paged: the new pages the allocator picked (each starts at its first slot), in the
        order it handed them out; which free page it picks is its own business."""
        ps = self.caches.model.page_size
        if ps == 1 or got is None:
            return None
        return [s // ps for s in got.tolist() if s % ps == 0]

    def _kv_alloc(self, n: int, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        got = yield
        want = self.caches.model.kv_alloc(n, self._chosen_pages(got))
        self.caches.agree(f"token_to_kv_pool_allocator.alloc({n})", "the slots handed out", None if got is None else got.tolist(), want)

    def paged_calls(self) -> Tuple[Tuple[str, Twin], ...]:
        """The allocator's calls beyond `alloc` and `free` (the paged allocator's; page size 1's
        where the release has them)."""
        return (("alloc_extend", self._kv_alloc_extend), ("alloc_decode", self._kv_alloc_decode),
                ("free_segment", self._kv_free), ("free_page_ids", self._kv_free_page_ids))

    def _kv_alloc_extend(self, prefix_lens: Any, prefix_lens_cpu: Any, seq_lens: Any, seq_lens_cpu: Any, last_loc: Any,
                         *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        prefix, seq, last = prefix_lens_cpu.tolist(), seq_lens_cpu.tolist(), last_loc.tolist()
        got = yield
        want = self.caches.model.kv_alloc_extend(prefix, seq, last, self._chosen_pages(got))
        call = f"token_to_kv_pool_allocator.alloc_extend(prefix_lens={prefix}, seq_lens={seq}, last_loc={last})"
        self.caches.agree(call, "the slots handed out", None if got is None else got.tolist(), want)

    def _kv_alloc_decode(self, seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> Generator[None, Any, None]:
        seq, last = seq_lens_cpu.tolist(), last_loc.tolist()
        got = yield
        want = self.caches.model.kv_alloc_decode(seq, last, self._chosen_pages(got))
        call = f"token_to_kv_pool_allocator.alloc_decode(seq_lens={seq}, last_loc={last})"
        self.caches.agree(call, "the slots handed out", None if got is None else got.tolist(), want)

    def _kv_free(self, index: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        """Slots by index, or a row's segment (`free_segment`): paged, the pages they lie on
        (in what order the allocator keeps its free pages is its own)."""
        slots = index.reshape(-1).tolist()
        yield
        self.caches.model.free_kv(slots)

    def _kv_free_page_ids(self, page_ids: Any) -> Generator[None, Any, None]:
        pages = page_ids.reshape(-1).tolist()
        yield
        self.caches.model.free_pages(pages)

    def _free_group_begin(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.free_group_begin()

    def _free_group_end(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.free_group_end()

    def _kv_clear(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.kv_clear()

    def _mamba_alloc(self, n: int) -> Generator[None, Any, None]:
        got = yield
        want = self.caches.model.mamba_alloc(n)
        self.caches.agree(f"mamba_allocator.alloc({n})", "the slots handed out", None if got is None else got.reshape(-1).tolist(), want)

    def _mamba_group_begin(self, n: int) -> Generator[None, Any, None]:
        yield
        self.caches.model.mamba_alloc_group_begin(n)

    def _mamba_group_end(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.mamba_alloc_group_end()

    def _mamba_free(self, index: Any) -> Generator[None, Any, None]:
        """A freed slot is no request's any more (the scheduler clears the request's field
        itself, where the mirror cannot see it)."""
        slots = index.reshape(-1).tolist()
        yield
        self.caches.model.free_mamba(slots)
        for mreq in self.twins.values():
            if mreq.mamba_slot in slots:
                mreq.mamba_slot = None
            if set(mreq.tracks) & set(slots):
                mreq.drop_tracks()

    def _req_alloc(self, reqs: List[Any]) -> Generator[None, Any, None]:
        call = f"req_to_token_pool.alloc(reqs {[r.rid for r in reqs]})"
        twins = [self.twin(r) for r in reqs]
        got = yield
        want = self.caches.model.req_alloc(twins)
        self.caches.agree(call, "the request slots handed out", None if got is None else list(got), want)
        for req, mreq in zip(reqs, twins):
            self._agree_mamba_slot(call, req, mreq)

    def _req_free(self, req: Any) -> Generator[None, Any, None]:
        mreq = self.twin(req)
        yield
        self.caches.model.req_free_slot(mreq, free_mamba=False)

    def _req_pool_clear(self) -> Generator[None, Any, None]:
        yield
        self.caches.model.req_pool_clear()


def _key_tokens(key: Any) -> Tuple[int, ...]:
    """The tokens a `RadixKey` stands for: its ids up to its `limit` (`len(key)`)."""
    return tuple(key.token_ids[: len(key)])


def _role(obj: Any, cut: Any) -> str:
    """How SGLang's scheduler names one of the objects the mirror wraps."""
    if obj is cut.cache:
        return "tree_cache"
    if obj is cut.kv:
        return "token_to_kv_pool_allocator"
    if obj is cut.mamba_slots:
        return "mamba_allocator"
    return "req_to_token_pool"


# the mirror of each tree cache (by id()) a scheduler of this process was built over
_MIRRORS: Dict[int, ModelMirror] = {}
# SGLang's own functions the hooks replaced (once per process)
_ORIGINALS: Dict[str, Callable] = {}


def _install_module_hooks() -> None:
    """`release_kv_cache` in every SGLang module that names it, and `Req.reset_for_retract`,
    made to reach the mirror of the tree cache they act on (once per process)."""
    if _ORIGINALS:
        return
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache import common

    original_release = _ORIGINALS["release_kv_cache"] = common.release_kv_cache

    def release_kv_cache(req: Any, tree_cache: Any, *args: Any, **kwargs: Any) -> None:
        mirror = _MIRRORS.get(id(tree_cache))
        if mirror is None:
            return original_release(req, tree_cache, *args, **kwargs)
        return mirror.release_kv_cache(req, tree_cache, *args, **kwargs)

    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("sglang.") and getattr(module, "release_kv_cache", None) is original_release:
            module.release_kv_cache = release_kv_cache

    original_reset = _ORIGINALS["reset_for_retract"] = Req.reset_for_retract

    def reset_for_retract(req: Any) -> None:
        original_reset(req)
        for mirror in _MIRRORS.values():
            if mirror.caches is not None:
                mirror.reset_for_retract(req)

    Req.reset_for_retract = reset_for_retract


class ModelMirror0520(ModelMirror):
    """The mirror of 0.5.20's era of calls (0.5.19 .. 0.5.21): a request's lock is
    `inc_lock_ref(node)` / `dec_lock_ref(node, receipt)` (the receipt on `req.lock_receipt`),
    a running request is cached by `cache_unfinished_req(req, chunked)`, released by
    `release_kv_cache(req, tree_cache, is_insert)`; no `touch_prefix`."""

    def request_calls(self) -> Tuple[Tuple[str, Twin], ...]:
        return (
            ("inc_lock_ref", self._inc_lock_ref),
            ("dec_lock_ref", self._dec_lock_ref),
            ("cache_unfinished_req", self._cache_unfinished_req),
        )

    @staticmethod
    def matched_len(result: Any) -> int:
        return len(result.device_indices)

    def _inc_lock_ref(self, node: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        path = self.path(node)
        yield
        self.caches.model.inc_lock(path)

    def _dec_lock_ref(self, node: Any, *args: Any, **kwargs: Any) -> Generator[None, Any, None]:
        path = self.path(node)
        yield
        try:
            self.caches.model.dec_lock(path)
        except ValueError as exc:
            raise Divergence(f"dec_lock_ref(node {node})", "the lock released", f"released node {node}", str(exc)) from None

    def _cache_unfinished_req(self, req: Any, chunked: bool = False, **kwargs: Any) -> Generator[None, Any, None]:
        return self._cached(req, f"cache_unfinished_req(req {req.rid}, chunked={chunked})", tuple(req.get_fill_ids()))

    def _release(self, req: Any, tree_cache: Any, is_insert: bool = True) -> Generator[None, Any, None]:
        return self._released(req, f"release_kv_cache(req {req.rid}, is_insert={is_insert})", is_insert)


class ModelMirror0518(ModelMirror0520):
    """The mirror of 0.5.16 .. 0.5.18: 0.5.20's calls, the scheduler's evictions all `evict`
    (`evict_for_alloc` came in 0.5.19)."""

    def tree_calls(self) -> Tuple[Tuple[str, Twin], ...]:
        return tuple((name, twin) for name, twin in super().tree_calls() if name != "evict_for_alloc")


# the mirror of each release whose calls are not 0.5.22's
ERA_MIRRORS = {
    **{version: ModelMirror0518 for version in ("0.5.16", "0.5.17", "0.5.18")},
    **{version: ModelMirror0520 for version in ("0.5.19", "0.5.20", "0.5.21")},
}


def mirror_class(version: str) -> type:
    """The mirror of SGLang `version`'s calls."""
    return ERA_MIRRORS.get(version, ModelMirror)
