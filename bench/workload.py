"""impl against SGLang's `MambaRadixCache`: one serving workload through both, and evict's cost.

    python -m bench.workload [--device cpu|cuda] [--caches impl sglang] [--conversations 200] [--repeats 9]
                             [--nodes 1000 10000 100000] [--seed 0] [--json FILE]

1. Throughput. One seeded workload (shared system prompts, multi-turn conversations that extend
   their earlier turns, chunked prefill, decode), served by the same small scheduler loop through
   each cache, batched as SGLang's scheduler batches (one KV allocation per prefill batch and per
   decode batch), with pools sized so KV and Mamba eviction run all the time. The rounds alternate
   between the caches; before each, the previous round's garbage is collected and the heap frozen
   (SGLang's `freeze_gc`). Prints requests/s for each cache and the ratios (best, median, and the
   median of the rounds' own ratios, the figure least moved by a noisy machine); the prefix tokens
   reused and evicted are printed too, and agree when the two caches behave the same.
2. Evict cost as the tree grows. A tree of N nodes (1k, 10k, 100k), half of its sequences locked
   and left least recently used, so the LRU tail is locked and internal nodes; then many small
   `evict` calls, each freeing a few tokens. Prints the median microseconds per call.

Both caches use their own pools (impl's with checking mode off, as in production); SGLang is
built as `harness.caches.sglang_0_5_4` builds it (reading the real clock). Without SGLang installed, only impl is measured.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

import impl
from bench import parse_with_device, write_json
from harness.usage import CommandParser
from strategies.config import CacheConfig


@dataclass
class Bench:
    """One cache under measurement with its pools."""

    name: str
    cache: Any
    kv: Any
    req_pool: Any
    key: Callable[[List[int]], Any]
    device: str
    on_cuda: bool = field(init=False)  # decided once: settle runs inside the timed evict calls

    def __post_init__(self) -> None:
        self.on_cuda = torch.device(self.device).type == "cuda"

    def settle(self) -> None:
        """Wait for the device's queued work, so that a clock read after it counts that work too."""
        if self.on_cuda:
            torch.cuda.synchronize(self.device)

    @property
    def mamba_pool(self) -> Any:
        return self.req_pool.mamba_pool

    def node_count(self) -> int:
        lru = self.cache.full_lru_list
        return len(lru) if self.name == "impl" else len(lru.cache)


def build(name: str, kv_size: int, mamba_size: int, req_size: int, max_context_len: int, device: str) -> Bench:
    """`impl` or `sglang` with pools of the given sizes on `device`."""
    if name == "impl":
        kv = impl.TokenToKVPoolAllocator(kv_size, device=device, debug=False)
        req_pool = impl.HybridReqToTokenPool(
            size=req_size, mamba_size=mamba_size, max_context_len=max_context_len, device=device, debug=False
        )
        cache = impl.MambaRadixCache(req_pool, kv, page_size=1)
        return Bench(name, cache, kv, req_pool, lambda tokens: impl.RadixKey(tokens), device)
    if name == "sglang":
        from harness.caches.sglang_0_5_4 import Sglang054Cache

        adapter = Sglang054Cache(CacheConfig(kv_size, mamba_size, req_size, max_context_len, device), virtual_clock=False)
        return Bench(name, adapter.cache, adapter.kv, adapter.req_pool, lambda tokens: adapter.key(tokens, None), device)
    raise ValueError(f"unknown cache {name!r}: expected impl or sglang")


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
        self.w = workload
        self.stats = ServeStats()
        self.row_dtype = bench.req_pool.req_to_token.dtype
        self._decoding: List[Running] = []  # the last decode batch, and its slots and positions
        self._rows = self._positions = torch.empty(0, dtype=torch.int64, device=bench.device)

    def _kv(self, n: int) -> torch.Tensor:
        """`n` KV slots in the row dtype, evicting first when the pool is short (SGLang's
        `alloc_token_slots`)."""
        if self.b.kv.available_size() < n:
            before = self.b.kv.available_size()
            self.b.cache.evict(n)
            self.stats.evict_calls += 1
            self.stats.evicted_tokens += self.b.kv.available_size() - before
        slots = self.b.kv.alloc(n)
        if slots is None:
            raise RuntimeError(f"{self.b.name}: out of KV slots (need {n}); the workload's pools are too small")
        return slots.to(self.row_dtype)

    def admit(self, rid: int, spec: RequestSpec) -> Running:
        req = impl.Req(rid, spec.prompt)
        match = self.b.cache.match_prefix(self.b.key(spec.prompt[:-1]), cow_mamba=True, req=req)
        req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
        self.b.cache.inc_lock_ref(req.last_node)
        if req.mamba_pool_idx is None and self.b.mamba_pool.available_size() < 1:
            self.b.cache.evict_mamba(1)
            self.stats.evict_mamba_calls += 1
        (req.req_pool_idx,) = self.b.req_pool.alloc(1, [req])
        done = len(req.prefix_indices)
        self.b.req_pool.write((req.req_pool_idx, slice(0, done)), req.prefix_indices.to(self.row_dtype))
        self.stats.reused_tokens += done
        return Running(req, spec, done)

    def prefill(self, batch: List[Running]) -> None:
        """The next chunk of each request in `batch`, then `cache_unfinished_req` for each
        (chunked until its prompt is done; then it gets its first output token)."""
        sizes = [min(self.w.chunk, run.prompt_len - run.done) for run in batch]
        slots = self._kv(sum(sizes))
        offset = 0
        for run, n in zip(batch, sizes):
            req, prompt = run.req, run.spec.prompt
            self.b.req_pool.write((req.req_pool_idx, slice(run.done, run.done + n)), slots[offset : offset + n])
            offset += n
            run.done += n
            req.fill_ids = prompt[: run.done]
            if run.done < len(prompt):
                self.b.cache.cache_unfinished_req(req, chunked=True)
            else:
                req.output_ids.append(run.spec.output[0])
                self.b.cache.cache_unfinished_req(req)

    def decode(self, batch: List[Running]) -> None:
        """One output token for each request in `batch`: the KV slot of its last token, then the
        next token. As in SGLang's `ScheduleBatch`, the batch's request slots and positions are
        tensors rebuilt only when the batch changes, and the positions advance in place."""
        slots = self._kv(len(batch))
        if batch != self._decoding:  # Running has no __eq__: the same requests, in order
            self._decoding = batch
            self._rows = torch.tensor([run.req.req_pool_idx for run in batch], device=self.b.device)
            self._positions = torch.tensor(
                [run.prompt_len + len(run.req.output_ids) - 1 for run in batch], device=self.b.device
            )
        else:
            self._positions += 1
        self.b.req_pool.write((self._rows, self._positions), slots)
        for run in batch:
            run.req.output_ids.append(run.spec.output[len(run.req.output_ids)])

    def finish(self, run: Running) -> None:
        self.b.cache.cache_finished_req(run.req)
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


# ----- 2. evict as the tree grows -------------------------------------------------------------


def grow_tree(bench: Bench, nodes: int, rng: random.Random) -> List[List[int]]:
    """Insert seeded sequences (sharing prefixes, so the tree has internal nodes) until it has
    `nodes` nodes; lock half of them and refresh the other half, so locked and internal nodes
    fill the least recently used end. Returns the unlocked sequences."""
    unlocked: List[List[int]] = []
    locked: List[List[int]] = []
    while bench.node_count() < nodes:
        tokens = [rng.randrange(8) for _ in range(rng.randint(6, 14))]
        # the tree gets a copy, as from a request's row in a real scheduler: an allocator's
        # result may be a view of its whole free list, which the tree would otherwise pin
        kv = bench.kv.alloc(len(tokens)).clone()
        mamba = bench.mamba_pool.alloc(1).clone()
        prefix_len, mamba_exist = bench.cache.insert(bench.key(tokens), kv, mamba)
        bench.kv.free(kv[:prefix_len])
        if mamba_exist:
            bench.mamba_pool.free(mamba)
        (locked if rng.random() < 0.5 else unlocked).append(tokens)
    for tokens in locked:
        bench.cache.inc_lock_ref(bench.cache.match_prefix(bench.key(tokens)).last_device_node)
    for tokens in unlocked:
        bench.cache.match_prefix(bench.key(tokens))
    return unlocked


def evict_cost(name: str, nodes: int, device: str, seed: int, calls: int = 200, tokens_per_call: int = 4) -> Dict[str, float]:
    """Median, mean and largest microseconds of `evict(tokens_per_call)` on a tree of `nodes` nodes."""
    rng = random.Random(seed)
    bench = build(name, kv_size=nodes * 16 + 64, mamba_size=nodes * 2 + 64, req_size=1, max_context_len=16, device=device)
    grow_tree(bench, nodes, rng)
    size_before = bench.node_count()
    times = []
    bench.settle()
    for _ in range(calls):
        started = time.perf_counter()
        bench.cache.evict(tokens_per_call)
        bench.settle()
        times.append(time.perf_counter() - started)
    return {
        "nodes": size_before,
        "median_us": round(statistics.median(times) * 1e6, 1),
        "mean_us": round(statistics.mean(times) * 1e6, 1),
        "max_us": round(max(times) * 1e6, 1),
        "evicted_nodes": size_before - bench.node_count(),
    }


# ----- the command ----------------------------------------------------------------------------


def available_caches(requested: Optional[List[str]]) -> List[str]:
    from harness.caches.sglang_loader import sglang_unavailable, sglang_version

    why = sglang_unavailable()
    if not why and sglang_version() != "0.5.4":
        # the workload calls the cache with 0.5.4's API, the release the benchmark compares with
        why = f"the benchmark drives SGLang 0.5.4's API; SGLang {sglang_version()} is installed"
    if requested is None:
        if why:
            print(f"sglang: not measured: {why}")
            return ["impl"]
        return ["impl", "sglang"]
    if "sglang" in requested and why:
        raise SystemExit(f"error: --caches sglang: {why}")
    return requested


def main(argv: Optional[List[str]] = None) -> int:
    parser = CommandParser(prog="python -m bench.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--caches", nargs="+", choices=("impl", "sglang"), help="default: impl, and sglang when installed")
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
    if "sglang" in caches:
        from harness.caches.sglang_loader import sglang_version

        versions["sglang"] = sglang_version()

    workload = make_workload(args.seed, args.conversations)
    print(
        f"workload: {len(workload.requests)} requests ({args.conversations} conversations x 4 turns, 4 shared system "
        f"prompts), {workload.concurrency} running at once, prefill chunk {workload.chunk}, KV pool {workload.kv_size}, "
        f"Mamba pool {workload.mamba_size}, device {args.device}"
    )
    served: Dict[str, ServeStats] = {}
    rounds: Dict[str, List[float]] = {name: [] for name in caches}
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        for name in caches:
            stats = serve(name, workload, args.device)
            rounds[name].append(stats.seconds)
            if name not in served or stats.seconds < served[name].seconds:
                served[name] = stats
    for name, stats in served.items():
        print(
            f"  {name:>7} {versions[name]:>7}: {stats.requests / stats.seconds:8.1f} requests/s  "
            f"(best of {args.repeats}: {stats.seconds:.2f} s, median {statistics.median(rounds[name]):.2f} s; "
            f"prefix tokens reused {stats.reused_tokens}, evict calls {stats.evict_calls}, tokens evicted "
            f"{stats.evicted_tokens}, evict_mamba calls {stats.evict_mamba_calls})"
        )
    ratios: Dict[str, float] = {}
    if len(served) == 2:
        ratio = served["sglang"].seconds / served["impl"].seconds
        median_ratio = statistics.median(rounds["sglang"]) / statistics.median(rounds["impl"])
        paired = statistics.median(s / i for s, i in zip(rounds["sglang"], rounds["impl"]))
        print(f"  impl / sglang throughput: {ratio:.2f}x (best against best; {median_ratio:.2f}x median against median; "
              f"{paired:.2f}x median of the {args.repeats} rounds' ratios)")
        ratios = {"best": round(ratio, 3), "median": round(median_ratio, 3), "paired_median": round(paired, 3)}

    print("evict(4) on a tree with half its sequences locked at the LRU end (median, and largest, microseconds per call):")
    costs: Dict[str, Dict[int, Dict[str, float]]] = {name: {} for name in caches}
    for nodes in args.nodes:
        line = f"  {nodes:>7} nodes:"
        for name in caches:
            cost = evict_cost(name, nodes, args.device, args.seed)
            costs[name][nodes] = cost
            line += f"  {name} {cost['median_us']:>9.1f} us (max {cost['max_us']:.0f})"
        if len(caches) == 2:
            line += f"  (sglang / impl {costs['sglang'][nodes]['median_us'] / costs['impl'][nodes]['median_us']:.1f}x)"
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
            "impl_over_sglang": ratios,
            "evict": {name: {str(n): c for n, c in per.items()} for name, per in costs.items()},
        }
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
