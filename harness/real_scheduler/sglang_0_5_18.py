"""`RealScheduler` for SGLang 0.5.17 and 0.5.18: 0.5.19's, with the server settings handed to
the model runner's n-gram embedding manager (`NgramEmbeddingManager.from_model(server_args=...)`;
0.5.19 reads them from the runtime context). Their requests keep their slots on themselves
(`req.req_pool_idx`, `req.mamba_pool_idx`, `req.kv` only the allocated length): the cache
adapter of their era reads them (`harness.caches.sglang_unified_0_5_17`)."""

from __future__ import annotations

from typing import Any, Dict

from harness.real_scheduler import sglang_0_5_19


class StandInWorker(sglang_0_5_19.StandInWorker):
    @staticmethod
    def ngram_settings(scheduler: Any) -> Dict[str, Any]:
        return {"server_args": scheduler.server_args}


class RealScheduler(sglang_0_5_19.RealScheduler):
    worker_class = StandInWorker
