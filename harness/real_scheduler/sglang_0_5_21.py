"""`RealScheduler` for SGLang 0.5.21: 0.5.23's builder (the same seams: `init_ipc_channels`,
`init_tp_model_worker`, `ingest_requests`, the radix cache backend, `reset_parallel_initialised`),
its stand-in forward pass reading the request's extend as 0.5.21 keeps it (`req.extend_range`,
not `prefix_len` and `extend_end`). The calls 0.5.21's scheduler makes on the tree are 0.5.20's
era (`inc_lock_ref` / `dec_lock_ref` receipts, `cache_unfinished_req`, `release_kv_cache(req,
tree_cache, is_insert)`): the protocol's mirror of that era (`scheduler_mirror`) pairs them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, Tuple

from harness.real_scheduler import sglang_0_5_23


class StandInWorker(sglang_0_5_23.StandInWorker):
    @staticmethod
    def extend_range(req: Any) -> Tuple[int, int]:
        return req.extend_range.start, req.extend_range.end


class RealScheduler(sglang_0_5_23.RealScheduler):
    worker_class = StandInWorker

    @staticmethod
    def allow_the_extra_buffer_on_the_host() -> None:
        """0.5.21's (and 0.5.20's) `validate_mamba_extra_buffer` asks the platform itself
        (`get_platform().is_cuda or ...`; 0.5.22 moved the question into
        `_platform_supports_mamba_cache_extra_buffer`): while it validates, the platform it reads
        says CUDA, and only there."""
        from sglang.srt.arg_groups import mamba_hook

        sglang_0_5_23.answering_while_it_runs(
            mamba_hook, "validate_mamba_extra_buffer", mamba_hook, "get_platform",
            lambda platform: lambda: SimpleNamespace(**{**vars_of(platform()), "is_cuda": True}),
        )


def vars_of(platform: Any) -> Dict[str, Any]:
    """A platform's facts by name (its public attributes)."""
    return {name: getattr(platform, name) for name in dir(platform) if not name.startswith("_")}
