"""`RealScheduler` for SGLang 0.5.21: 0.5.23's builder (the same seams: `init_ipc_channels`,
`init_tp_model_worker`, `ingest_requests`, the radix cache backend, `reset_parallel_initialised`),
its stand-in forward pass reading the request's extend as 0.5.21 keeps it (`req.extend_range`,
not `prefix_len` and `extend_end`). The calls 0.5.21's scheduler makes on the tree are 0.5.20's
era (`inc_lock_ref` / `dec_lock_ref` receipts, `cache_unfinished_req`, `release_kv_cache(req,
tree_cache, is_insert)`): the protocol's mirror of that era (`scheduler_mirror`) pairs them."""

from __future__ import annotations

from typing import Any, Tuple

from harness.real_scheduler import sglang_0_5_23


class StandInWorker(sglang_0_5_23.StandInWorker):
    @staticmethod
    def extend_range(req: Any) -> Tuple[int, int]:
        return req.extend_range.start, req.extend_range.end


class RealScheduler(sglang_0_5_23.RealScheduler):
    worker_class = StandInWorker
