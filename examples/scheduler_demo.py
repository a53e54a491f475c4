"""A scheduler-like run of the cache on one device, with the calls SGLang's scheduler makes.

Conversations share a system prompt and extend their earlier turns. Each request is matched
with `cow_mamba=True`, locked, given a request slot (evicting a Mamba state when short) and KV
slots (evicting KV when short), prefilled in chunks through `cache_unfinished_req`, decoded, and
finished through `cache_finished_req`. Run: `python examples/scheduler_demo.py [--device cuda]`.
"""

from __future__ import annotations

import argparse
import random
from typing import List

import torch

from impl import HybridReqToTokenPool, MambaRadixCache, RadixKey, Req, TokenToKVPoolAllocator


class MiniScheduler:
    def __init__(self, device: str, kv_size: int, mamba_size: int, chunk: int):
        self.kv = TokenToKVPoolAllocator(kv_size, device=device)
        self.pool = HybridReqToTokenPool(size=4, mamba_size=mamba_size, max_context_len=512, device=device)
        self.cache = MambaRadixCache(self.pool, self.kv, page_size=1)
        self.chunk = chunk
        self.device = torch.device(device)

    def _alloc_kv(self, n: int) -> torch.Tensor:
        if self.kv.available_size() < n:
            self.cache.evict(n)
        slots = self.kv.alloc(n)
        if slots is None:
            raise RuntimeError(f"out of KV slots: need {n}, {self.kv.available_size()} free")
        return slots

    def run(self, rid: int, prompt: List[int], new_tokens: int, rng: random.Random) -> List[int]:
        req = Req(rid, prompt)
        match = self.cache.match_prefix(RadixKey(prompt[:-1]), cow_mamba=True, req=req)
        req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
        self.cache.inc_lock_ref(req.last_node)

        if self.pool.mamba_pool.available_size() < 1:
            self.cache.evict_mamba(1)
        (req.req_pool_idx,) = self.pool.alloc(1, [req])
        done = len(req.prefix_indices)
        self.pool.write((req.req_pool_idx, slice(0, done)), req.prefix_indices.to(torch.int32))

        while done < len(prompt):
            n = min(self.chunk, len(prompt) - done)
            slots = self._alloc_kv(n)
            self.pool.write((req.req_pool_idx, slice(done, done + n)), slots.to(torch.int32))
            done += n
            req.fill_ids = prompt[:done]
            if done < len(prompt):
                self.cache.cache_unfinished_req(req, chunked=True)
        req.output_ids.append(rng.randrange(100))
        self.cache.cache_unfinished_req(req)

        for _ in range(new_tokens - 1):
            position = len(req.origin_input_ids) + len(req.output_ids) - 1
            slot = self._alloc_kv(1)
            self.pool.write((req.req_pool_idx, slice(position, position + 1)), slot.to(torch.int32))
            req.output_ids.append(rng.randrange(100))
        self.cache.cache_finished_req(req)
        return req.origin_input_ids + req.output_ids


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    sched = MiniScheduler(args.device, kv_size=400, mamba_size=12, chunk=16)
    system_prompt = [rng.randrange(100) for _ in range(40)]
    histories = [list(system_prompt) for _ in range(args.conversations)]
    rid = 0
    reused = 0
    for _turn in range(args.turns):
        for conv, history in enumerate(histories):
            prompt = history + [rng.randrange(100) for _ in range(rng.randint(3, 12))]
            before = sched.cache.match_prefix(RadixKey(prompt[:-1])).device_indices.numel()
            reused += before
            histories[conv] = sched.run(rid, prompt, new_tokens=rng.randint(2, 8), rng=rng)[-120:]
            rid += 1
    sched.cache.sanity_check()
    full, mamba = sched.cache.total_size()
    summary = {
        "requests": rid,
        "prefix tokens reused": reused,
        "tree KV tokens": full,
        "tree Mamba states": mamba,
        "free KV slots": sched.kv.available_size(),
        "free Mamba slots": sched.pool.mamba_pool.available_size(),
    }
    for name, value in summary.items():
        print(f"{name:>22}: {value}")
    return summary


if __name__ == "__main__":
    main()
