"""impl against SGLang's own hybrid cache: one serving workload through each, and what each
operation costs.

    python -m bench.workload [--device cpu|cuda] [--caches impl sglang ...] [--conversations 200]
                             [--repeats 9] [--nodes 1000 10000 100000] [--seed 0] [--json FILE]

The caches: `impl`; with SGLang 0.5.4 installed, `sglang` (its `MambaRadixCache`); with 0.5.23,
`sglang-python` and `sglang-rust` (its `UnifiedRadixCache` on each tree core). Each cache is
driven by its own release's calls (`Api054`: 0.5.4's API, which impl shares; `Api0523`: 0.5.23's
`match_prefix(MatchPrefixParams)`, lock receipts, `ensure_mamba_capacity`, `checkpoint_kv_cache`,
`release_kv_cache`, `evict_for_alloc` with the shortfall).

1. Throughput. One seeded workload (shared system prompts, multi-turn conversations that extend
   their earlier turns, chunked prefill, decode), served by the same small scheduler loop through
   each cache, batched as SGLang's scheduler batches (one KV allocation per prefill batch and per
   decode batch), with pools sized so KV and Mamba eviction run all the time. The rounds alternate
   between the caches; before each, the previous round's garbage is collected and the heap frozen
   (SGLang's `freeze_gc`). Prints requests/s for each cache and the ratios against impl (best,
   median, and the median of the rounds' own ratios, the figure least moved by a noisy machine);
   the prefix tokens reused and evicted are printed too.
2. Each operation's cost as the tree grows. A tree of N nodes (1k, 10k, 100k), built by the same
   seeded inserts in every cache, half of its sequences locked and left least recently used, so
   the LRU tail is locked and internal nodes; then, timed call by call: `match_prefix` of a cached
   sequence (with the prefix's KV slots, which 0.5.23 reads in a second call), match + lock +
   unlock, `insert` of a new sequence, and `evict` freeing a few tokens.
   Prints the median microseconds per call, and each cache's against impl's. (A request's whole
   cache work is part 1: seconds per request.)

Every cache uses its own pools (impl's with checking mode off, as in production); SGLang's are
built as `harness.caches` builds them (0.5.4's tree reading the real clock). Caches that are not
installed are left out, saying so.
"""

from __future__ import annotations

import gc
import importlib
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import impl
from bench import parse_with_device, write_json
from harness.usage import CommandParser
from strategies.config import CacheConfig


class Api054:
    """SGLang 0.5.4's calls, which impl shares: locks on nodes, `cache_unfinished_req`,
    `cache_finished_req`, `evict(n)` for all `n` tokens asked for."""

    def __init__(self, cache: Any, kv: Any, req_pool: Any, key: Callable[[List[int]], Any]):
        self.cache, self.kv, self.req_pool, self.key = cache, kv, req_pool, key
        self.mamba_slots = req_pool.mamba_pool
        self.row_dtype = req_pool.req_to_token.dtype

    def node_count(self) -> Optional[int]:
        lru = self.cache.full_lru_list
        return len(lru) if isinstance(self.cache, impl.MambaRadixCache) else len(lru.cache)

    def new_req(self, rid: int, prompt: List[int]) -> Any:
        return impl.Req(rid, prompt)

    def admit(self, req: Any, prompt: List[int]) -> Tuple[int, int]:
        """Match with copy-on-write, lock, a request slot (a Mamba state evicted when none is
        free), the prefix written into the row; returns the prefix length."""
        match = self.cache.match_prefix(self.key(prompt[:-1]), cow_mamba=True, req=req)
        req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
        self.cache.inc_lock_ref(req.last_node)
        evicted = 0
        if req.mamba_pool_idx is None and self.mamba_slots.available_size() < 1:
            self.cache.evict_mamba(1)
            evicted = 1
        (req.req_pool_idx,) = self.req_pool.alloc(1, [req])
        done = len(req.prefix_indices)
        self.req_pool.write((req.req_pool_idx, slice(0, done)), req.prefix_indices.to(self.row_dtype))
        return done, evicted

    def row(self, req: Any) -> int:
        return req.req_pool_idx

    def chunk_done(self, req: Any, prompt: List[int], done: int, first_output: Optional[int]) -> None:
        """The chunk up to `done` was computed; with its first output token the prompt is done."""
        req.fill_ids = prompt[:done]
        if first_output is None:
            self.cache.cache_unfinished_req(req, chunked=True)
        else:
            req.output_ids.append(first_output)
            self.cache.cache_unfinished_req(req)

    def decoded(self, req: Any, token: int) -> None:
        req.output_ids.append(token)

    def finish(self, req: Any) -> None:
        self.cache.cache_finished_req(req)

    def evict_for(self, n: int) -> None:
        """`evict_from_tree_cache(n)` when the pool has fewer than `n` free."""
        self.cache.evict(n)

    # one call each, for part 2
    def match(self, tokens: List[int]) -> Any:
        return self.cache.match_prefix(self.key(tokens)).last_device_node

    def lock(self, node: Any) -> Any:
        self.cache.inc_lock_ref(node)
        return node

    def unlock(self, handle: Any) -> None:
        self.cache.dec_lock_ref(handle)

    def insert(self, tokens: List[int]) -> None:
        """A new sequence with fresh KV slots and a state (copies, as from a request's row: an
        allocator's result may be a view of its whole free list, which the tree would pin); the
        caller frees what the tree did not take."""
        kv = self.kv.alloc(len(tokens)).clone()
        mamba = self.mamba_slots.alloc(1).clone()
        prefix_len, mamba_exist = self.cache.insert(self.key(tokens), kv, mamba)
        self.kv.free(kv[:prefix_len])
        if mamba_exist:
            self.mamba_slots.free(mamba)

    def evict(self, n: int) -> None:
        self.cache.evict(n)


class Api0523(Api054):
    """SGLang 0.5.23's calls for its `UnifiedRadixCache`, as its scheduler helpers make them
    (`harness.caches.sglang_unified` drives the same calls under the harness)."""

    def __init__(self, adapter: Any):
        super().__init__(adapter.cache, adapter.kv, adapter.req_pool, lambda tokens: adapter.key(tokens, None))
        self.adapter, self.sgl = adapter, adapter.sgl
        self.mamba_slots = adapter.mamba_slots
        self.allocation = importlib.import_module("sglang.srt.mem_cache.allocation")

    def node_count(self) -> Optional[int]:
        core = self.cache.tree_core
        return len(core._node_arena) - 1 if hasattr(core, "_node_arena") else None  # the root aside

    def new_req(self, rid: int, prompt: List[int]) -> Any:
        return self.adapter.new_req(rid, prompt, None)

    def admit(self, req: Any, prompt: List[int]) -> Tuple[int, int]:
        """`match_kv_cache` (copy-on-write, deferred copy made at once), `req.lock =
        tree_cache.lock(...)`, `alloc_req_slots` (`ensure_mamba_capacity`, `alloc(reqs)`), the
        prefix written into the row."""
        sgl, cache = self.sgl, self.cache
        result = cache.match_prefix(sgl.MatchPrefixParams(key=self.key(prompt[:-1]), cow_mamba=True, req=req))
        self.adapter.copy_deferred_cow(req)
        req.prefix_len = req.kv.cache_protected_len = result.device_prefix_len
        req.last_node = result.last_device_node
        req.lock = cache.lock(req.last_node)
        evicted = 0
        if not req.kv.holds_mamba and self.mamba_slots.available_size() < 1:
            evicted = 1
        self.allocation.ensure_mamba_capacity(self.req_pool, [req], cache)
        self.req_pool.alloc([req])
        done = req.prefix_len
        if done:
            self.req_pool.write((req.kv.req_pool_idx, slice(0, done)), cache.prefix_device_indices(req).to(self.row_dtype))
        return done, evicted

    def row(self, req: Any) -> int:
        return req.kv.req_pool_idx

    def chunk_done(self, req: Any, prompt: List[int], done: int, first_output: Optional[int]) -> None:
        """`alloc_for_extend`'s bookkeeping, then `checkpoint_kv_cache`."""
        req.kv.kv_allocated_len = req.kv.kv_committed_len = done
        if first_output is not None:
            req.output_ids.append(first_output)
        req.refresh_fill_ids()
        req.extend_end = done
        self.sgl.common.checkpoint_kv_cache(req, self.cache)

    def decoded(self, req: Any, token: int) -> None:
        """`alloc_for_decode`'s bookkeeping (one more KV slot, committed), then the token."""
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1
        req.output_ids.append(token)

    def finish(self, req: Any) -> None:
        req.finished_reason = self.sgl.FINISH_LENGTH(length=len(req.output_ids))
        self.sgl.common.release_kv_cache(req, self.cache, checkpoint=True)

    def evict_for(self, n: int) -> None:
        """`evict_to_free_tokens`: `evict_for_alloc` with the shortfall."""
        self.cache.evict_for_alloc(self.sgl.EvictParams(num_tokens=n - self.kv.available_size()))

    def match(self, tokens: List[int]) -> Any:
        """`match_prefix`, and the prefix's KV slots, which 0.5.23's match leaves out (its result
        is a length and a node id; the scheduler reads the slots with `prefix_device_indices`)
        and 0.5.4's and impl's return."""
        cache = self.cache
        result = cache.match_prefix(self.sgl.MatchPrefixParams(key=self.key(tokens)))
        cache.tree_core.collect_full_device_indices(result.last_device_node, cache.root_node_handle())
        return result.last_device_node

    def lock(self, node: Any) -> Any:
        return self.cache.lock(node)

    def unlock(self, handle: Any) -> None:
        self.cache.unlock(handle)

    def insert(self, tokens: List[int]) -> None:
        """0.5.23's insert frees the caller's duplicate KV itself."""
        kv = self.kv.alloc(len(tokens)).clone()
        mamba = self.mamba_slots.alloc(1).clone()
        result = self.cache.insert(self.sgl.InsertParams(key=self.key(tokens), value=kv, mamba_value=mamba))
        if result.mamba_exist:
            self.mamba_slots.free(mamba)

    def evict(self, n: int) -> None:
        self.cache.evict(self.sgl.EvictParams(num_tokens=n))


@dataclass
class Bench:
    """One cache under measurement with its pools and its release's calls."""

    name: str
    api: Api054
    device: str
    on_cuda: bool = field(init=False)  # decided once: settle runs inside the timed calls

    def __post_init__(self) -> None:
        self.on_cuda = torch.device(self.device).type == "cuda"

    def settle(self) -> None:
        """Wait for the device's queued work, so that a clock read after it counts that work too."""
        if self.on_cuda:
            torch.cuda.synchronize(self.device)

    @property
    def kv(self) -> Any:
        return self.api.kv


CACHES = ("impl", "sglang", "sglang-python", "sglang-rust")


def build(name: str, kv_size: int, mamba_size: int, req_size: int, max_context_len: int, device: str) -> Bench:
    """One of `CACHES` with pools of the given sizes on `device`."""
    config = CacheConfig(kv_size, mamba_size, req_size, max_context_len, device)
    if name == "impl":
        kv = impl.TokenToKVPoolAllocator(kv_size, device=device, debug=False)
        req_pool = impl.HybridReqToTokenPool(
            size=req_size, mamba_size=mamba_size, max_context_len=max_context_len, device=device, debug=False
        )
        cache = impl.MambaRadixCache(req_pool, kv, page_size=1)
        return Bench(name, Api054(cache, kv, req_pool, lambda tokens: impl.RadixKey(tokens)), device)
    if name == "sglang":
        from harness.caches.sglang_0_5_4 import Sglang054Cache

        adapter = Sglang054Cache(config, virtual_clock=False)
        return Bench(name, Api054(adapter.cache, adapter.kv, adapter.req_pool, lambda tokens: adapter.key(tokens, None)), device)
    if name in ("sglang-python", "sglang-rust"):
        from harness.caches.sglang_unified_0_5_22 import SglangUnified0522Cache

        return Bench(name, Api0523(SglangUnified0522Cache(config, tree_core=name.split("-")[1])), device)
    raise ValueError(f"unknown cache {name!r}: expected one of {list(CACHES)}")


# ----- 1. the serving workload ----------------------------------------------------------------


@dataclass
class RequestSpec:
    prompt: List[int]
    output: List[int]


@dataclass
class Workload:
    """Requests in arrival order, and the pool sizes that keep eviction busy while serving them."""

    requests: List[RequestSpec]
    concurrency: int
    chunk: int
    kv_size: int
    mamba_size: int
    max_context_len: int


def make_workload(seed: int, conversations: int, turns: int = 4, concurrency: int = 8, chunk: int = 64) -> Workload:
    """Shared system prompts; each conversation's turn extends its previous turn's prompt and
    output; turns arrive in rounds, conversations shuffled within a round."""
    rng = random.Random(seed)

    def tokens(lo: int, hi: int) -> List[int]:
        return [rng.randrange(32000) for _ in range(rng.randint(lo, hi))]

    system_prompts = [tokens(64, 192) for _ in range(4)]
    histories = [list(rng.choice(system_prompts)) for _ in range(conversations)]
    requests: List[RequestSpec] = []
    for _ in range(turns):
        order = list(range(conversations))
        rng.shuffle(order)
        for conv in order:
            prompt = histories[conv] + tokens(16, 64)
            output = tokens(8, 32)
            requests.append(RequestSpec(prompt, output))
            histories[conv] = prompt + output
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    distinct = sum(len(h) for h in histories)
    # KV for a sixth of what the conversations leave behind; the tree takes a Mamba state every
    # prefill chunk, so states for somewhat more tokens than the KV pool holds: KV eviction runs,
    # and Mamba eviction too, without Mamba eviction alone freeing the KV
    kv_size = max(concurrency * longest * 5 // 4, distinct // 6)
    mamba_size = max(4 * concurrency, kv_size * 3 // (2 * chunk))
    return Workload(requests, concurrency, chunk, kv_size, mamba_size, max_context_len=longest + 1)


class Running:
    """A request being served; its lengths are kept as ints, so the loop's per-iteration
    bookkeeping is a few comparisons, not the cost it is meant to leave to the caches."""

    __slots__ = ("req", "spec", "done", "prompt_len", "output_len")

    def __init__(self, req: Any, spec: RequestSpec, done: int):
        self.req = req
        self.spec = spec
        self.done = done  # prompt tokens computed
        self.prompt_len = len(spec.prompt)
        self.output_len = len(spec.output)

    @property
    def prefilling(self) -> bool:
        return self.done < self.prompt_len

    @property
    def complete(self) -> bool:
        """Prompt computed and every output token produced: ready for `cache_finished_req`."""
        return self.done == self.prompt_len and len(self.req.output_ids) == self.output_len


@dataclass
class ServeStats:
    requests: int = 0
    reused_tokens: int = 0
    evict_calls: int = 0
    evicted_tokens: int = 0
    evict_mamba_calls: int = 0
    seconds: float = 0.0
    extra: Dict[str, int] = field(default_factory=dict)


class Server:
    """A minimal continuous-batching scheduler making SGLang's cache calls, batched as SGLang's
    scheduler batches them: each iteration admits requests, runs one prefill chunk of every
    request still prefilling (one KV allocation for the whole chunk batch) and one decode token of
    every other request (one KV allocation and one `req_to_token` write for the whole batch)."""

    def __init__(self, bench: Bench, workload: Workload):
        self.b = bench
        self.api = bench.api
        self.w = workload
        self.stats = ServeStats()
        self.row_dtype = self.api.row_dtype
        self._decoding: List[Running] = []  # the last decode batch, and its slots and positions
        self._rows = self._positions = torch.empty(0, dtype=torch.int64, device=bench.device)

    def _kv(self, n: int) -> torch.Tensor:
        """`n` KV slots in the row dtype, evicting first when the pool is short (SGLang's
        `alloc_token_slots`)."""
        kv = self.api.kv
        if kv.available_size() < n:
            before = kv.available_size()
            self.api.evict_for(n)
            self.stats.evict_calls += 1
            self.stats.evicted_tokens += kv.available_size() - before
        slots = kv.alloc(n)
        if slots is None:
            raise RuntimeError(f"{self.b.name}: out of KV slots (need {n}); the workload's pools are too small")
        return slots.to(self.row_dtype)

    def admit(self, rid: int, spec: RequestSpec) -> Running:
        req = self.api.new_req(rid, spec.prompt)
        done, evicted_mamba = self.api.admit(req, spec.prompt)
        self.stats.evict_mamba_calls += evicted_mamba
        self.stats.reused_tokens += done
        return Running(req, spec, done)

    def prefill(self, batch: List[Running]) -> None:
        """The next chunk of each request in `batch`, then the request goes into the tree
        (chunked until its prompt is done; then it gets its first output token)."""
        sizes = [min(self.w.chunk, run.prompt_len - run.done) for run in batch]
        slots = self._kv(sum(sizes))
        offset = 0
        for run, n in zip(batch, sizes):
            req, prompt = run.req, run.spec.prompt
            self.api.req_pool.write((self.api.row(req), slice(run.done, run.done + n)), slots[offset : offset + n])
            offset += n
            run.done += n
            self.api.chunk_done(req, prompt, run.done, None if run.done < len(prompt) else run.spec.output[0])

    def decode(self, batch: List[Running]) -> None:
        """One output token for each request in `batch`: the KV slot of its last token, then the
        next token. As in SGLang's `ScheduleBatch`, the batch's request slots and positions are
        tensors rebuilt only when the batch changes, and the positions advance in place."""
        slots = self._kv(len(batch))
        if batch != self._decoding:  # Running has no __eq__: the same requests, in order
            self._decoding = batch
            self._rows = torch.tensor([self.api.row(run.req) for run in batch], device=self.b.device)
            self._positions = torch.tensor(
                [run.prompt_len + len(run.req.output_ids) - 1 for run in batch], device=self.b.device
            )
        else:
            self._positions += 1
        self.api.req_pool.write((self._rows, self._positions), slots)
        for run in batch:
            self.api.decoded(run.req, run.spec.output[len(run.req.output_ids)])

    def finish(self, run: Running) -> None:
        self.api.finish(run.req)
        self.stats.requests += 1

    def serve(self) -> ServeStats:
        waiting = deque(enumerate(self.w.requests))
        running: List[Running] = []
        self.b.settle()
        started = time.perf_counter()
        while waiting or running:
            while waiting and len(running) < self.w.concurrency:
                running.append(self.admit(*waiting.popleft()))
            prefilling, decoding = [], []
            for run in running:
                (prefilling if run.prefilling else decoding).append(run)
            if prefilling:
                self.prefill(prefilling)
            if decoding:
                self.decode(decoding)
            still_running = []
            for run in running:
                if run.complete:
                    self.finish(run)
                else:
                    still_running.append(run)
            running = still_running
        self.b.settle()
        self.stats.seconds = time.perf_counter() - started
        return self.stats


def serve(name: str, workload: Workload, device: str) -> ServeStats:
    bench = build(name, workload.kv_size, workload.mamba_size, workload.concurrency, workload.max_context_len, device)
    # as in an SGLang server after its freeze_gc call: the heap built before serving (torch,
    # modules, pools) is frozen out of the collector's scans, which still cover everything
    # serving allocates; the previous round's garbage is collected first, off this round's clock
    gc.collect()
    gc.freeze()
    try:
        return Server(bench, workload).serve()
    finally:
        gc.unfreeze()


# ----- 2. each operation as the tree grows ------------------------------------------------------

OPERATIONS = ("match", "match + lock + unlock", "insert", "evict")


def grow_tree(bench: Bench, nodes: int, rng: random.Random, sequences: Optional[int] = None) -> Tuple[int, List[List[int]], List[Any]]:
    """Insert seeded sequences (sharing prefixes, so the tree has internal nodes) until the tree
    has `nodes` nodes (or exactly `sequences` of them, for a cache whose nodes cannot be counted:
    the same seeded inserts build the same tree in every correct cache); lock half of them and
    refresh the other half, so locked and internal nodes fill the least recently used end.
    Returns the sequences inserted, the unlocked sequences and the lock handles."""
    api = bench.api
    unlocked: List[List[int]] = []
    locked: List[List[int]] = []
    inserted = 0
    while (api.node_count() < nodes) if sequences is None else (inserted < sequences):
        tokens = [rng.randrange(8) for _ in range(rng.randint(6, 14))]
        api.insert(tokens)
        inserted += 1
        (locked if rng.random() < 0.5 else unlocked).append(tokens)
    handles = [api.lock(api.match(tokens)) for tokens in locked]
    for tokens in unlocked:
        api.match(tokens)
    return inserted, unlocked, handles


def operation_costs(
    name: str, nodes: int, device: str, seed: int, sequences: Optional[int] = None, calls: int = 200, tokens_per_call: int = 4
) -> Dict[str, Any]:
    """Median microseconds per call of each of `OPERATIONS` on a tree of `nodes` nodes (built by
    `sequences` inserts, when given), and how many sequences built it."""
    rng = random.Random(seed)
    bench = build(name, kv_size=nodes * 16 + 64 + calls * 16, mamba_size=nodes * 2 + 64 + calls,
                  req_size=1, max_context_len=16, device=device)
    api = bench.api
    inserted, unlocked, _ = grow_tree(bench, nodes, rng, sequences)
    fresh = random.Random(seed + 1)
    new_sequences = [[8 + fresh.randrange(8) for _ in range(fresh.randint(6, 14))] for _ in range(calls)]

    def timed(call: Callable[[int], None]) -> float:
        times = []
        bench.settle()
        for i in range(calls):
            started = time.perf_counter()
            call(i)
            bench.settle()
            times.append(time.perf_counter() - started)
        return round(statistics.median(times) * 1e6, 1)

    # the tree built is frozen out of the collector's scans, as in a server after `freeze_gc`: a
    # full collection over 100k nodes would otherwise land in whichever call it interrupts
    gc.collect()
    gc.freeze()
    for i in range(calls):  # the sequences the matches walk, brought into the CPU's caches once
        api.match(unlocked[i % len(unlocked)])
    try:
        costs = {
            "match": timed(lambda i: api.match(unlocked[i % len(unlocked)])),
            "match + lock + unlock": timed(lambda i: api.unlock(api.lock(api.match(unlocked[i % len(unlocked)])))),
            "insert": timed(lambda i: api.insert(new_sequences[i])),
            "evict": timed(lambda i: api.evict(tokens_per_call)),
        }
    finally:
        gc.unfreeze()
    return {"nodes": nodes, "sequences": inserted, "median_us": costs}


# ----- the command ----------------------------------------------------------------------------


def installed_caches() -> Tuple[List[str], str]:
    """The SGLang caches the installed release offers the benchmark, and why not, when none."""
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version

    why = sglang_unavailable()
    if why:
        return [], why
    version = sglang_version()
    if version == "0.5.4":
        return ["sglang"], ""
    if version == "0.5.23":
        return ["sglang-python", "sglang-rust"], ""
    return [], f"the benchmark drives SGLang 0.5.4's and 0.5.23's APIs; SGLang {version} is installed"


def available_caches(requested: Optional[List[str]]) -> List[str]:
    offered, why = installed_caches()
    if requested is None:
        if why:
            print(f"sglang: not measured: {why}")
        return ["impl"] + offered
    missing = [name for name in requested if name != "impl" and name not in offered]
    if missing:
        raise SystemExit(f"error: --caches {' '.join(missing)}: {why or f'the installed SGLang offers {offered}'}")
    return requested


def _ratio_line(label: str, seconds: Dict[str, float], rounds: Dict[str, List[float]], name: str) -> str:
    best = seconds[name] / seconds["impl"]
    median = statistics.median(rounds[name]) / statistics.median(rounds["impl"])
    paired = statistics.median(s / i for s, i in zip(rounds[name], rounds["impl"]))
    return (f"  impl / {label} throughput: {best:.2f}x (best against best; {median:.2f}x median against median; "
            f"{paired:.2f}x median of the {len(rounds[name])} rounds' ratios)"), {
        "best": round(best, 3), "median": round(median, 3), "paired_median": round(paired, 3)}


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog="python -m bench.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--caches", nargs="+", choices=CACHES, help="default: impl, and SGLang's caches when installed")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=9, help="serve the workload this many times through each cache (default 9)")
    parser.add_argument("--nodes", nargs="+", type=int, default=[1000, 10000, 100000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parse_with_device(parser, argv)
    if args.conversations < 1 or args.repeats < 1 or any(n < 1 for n in args.nodes):
        parser.error(f"--conversations, --repeats and --nodes must be positive, got {args.conversations}, "
                     f"{args.repeats} and {args.nodes}")
    caches = available_caches(args.caches)
    versions = {"impl": impl.__version__}
    if len(caches) > 1 or caches[0] != "impl":
        from harness.caches.sglang_loader import sglang_version

        versions.update({name: sglang_version() for name in caches if name != "impl"})

    workload = make_workload(args.seed, args.conversations)
    print(
        f"workload: {len(workload.requests)} requests ({args.conversations} conversations x 4 turns, 4 shared system "
        f"prompts), {workload.concurrency} running at once, prefill chunk {workload.chunk}, KV pool {workload.kv_size}, "
        f"Mamba pool {workload.mamba_size}, device {args.device}"
    )
    served: Dict[str, ServeStats] = {}
    rounds: Dict[str, List[float]] = {name: [] for name in caches}
    for _ in range(args.repeats):  # interleaved, so every cache sees the same machine load
        for name in caches:
            stats = serve(name, workload, args.device)
            rounds[name].append(stats.seconds)
            if name not in served or stats.seconds < served[name].seconds:
                served[name] = stats
    for name, stats in served.items():
        print(
            f"  {name:>13} {versions[name]:>7}: {stats.requests / stats.seconds:8.1f} requests/s, "
            f"{stats.seconds / stats.requests * 1e6:7.0f} us of cache work a request  "
            f"(best of {args.repeats}: {stats.seconds:.2f} s, median {statistics.median(rounds[name]):.2f} s; "
            f"prefix tokens reused {stats.reused_tokens}, evict calls {stats.evict_calls}, tokens evicted "
            f"{stats.evicted_tokens}, Mamba evictions {stats.evict_mamba_calls})"
        )
    ratios: Dict[str, Dict[str, float]] = {}
    if "impl" in served:
        for name in served:
            if name != "impl":
                line, ratios[name] = _ratio_line(name, {n: s.seconds for n, s in served.items()}, rounds, name)
                print(line)

    print("each operation on a tree with half its sequences locked at the LRU end (median microseconds per call):")
    costs: Dict[str, Dict[int, Dict[str, Any]]] = {name: {} for name in caches}
    for nodes in args.nodes:
        sequences = None
        for name in sorted(caches, key=lambda n: n != "impl"):  # impl first: it counts its nodes
            cost = operation_costs(name, nodes, args.device, args.seed, sequences)
            sequences = sequences or cost["sequences"]
            costs[name][nodes] = cost
        print(f"  {nodes:>7} nodes ({sequences} sequences):")
        for op in OPERATIONS:
            line = f"    {op:>22}:"
            for name in caches:
                line += f"  {name} {costs[name][nodes]['median_us'][op]:>8.1f}"
                if name != "impl" and "impl" in costs:
                    line += f" ({costs[name][nodes]['median_us'][op] / costs['impl'][nodes]['median_us'][op]:.1f}x impl)"
            print(line)

    if args.json:
        result = {
            "device": args.device,
            "seed": args.seed,
            "versions": versions,
            "workload": {"requests": len(workload.requests), "concurrency": workload.concurrency, "chunk": workload.chunk,
                         "kv_size": workload.kv_size, "mamba_size": workload.mamba_size},
            "throughput": {name: {"requests_per_second": round(s.requests / s.seconds, 2), "best_seconds": round(s.seconds, 3),
                                  "all_seconds": [round(t, 3) for t in rounds[name]],
                                  "reused_tokens": s.reused_tokens, "evict_calls": s.evict_calls,
                                  "evicted_tokens": s.evicted_tokens, "evict_mamba_calls": s.evict_mamba_calls}
                           for name, s in served.items()},
            "impl_over": ratios,
            "operations": {name: {str(n): c for n, c in per.items()} for name, per in costs.items()},
        }
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
