"""`RealScheduler` for SGLang 0.5.17 and 0.5.18: 0.5.19's, with the server settings handed to
the model runner's n-gram embedding manager (`NgramEmbeddingManager.from_model(server_args=...)`;
0.5.19 reads them from the runtime context), their extra-buffer validation opened on the host as
`ServerArgs` runs it. Their requests keep their slots on themselves
(`req.req_pool_idx`, `req.mamba_pool_idx`, `req.kv` only the allocated length): the cache
adapter of their era reads them (`harness.caches.sglang_unified_0_5_17`)."""

from __future__ import annotations

from typing import Any, Dict

from packaging.version import Version

from harness.caches.sglang_loader import sglang_version
from harness.real_scheduler import sglang_0_5_19, sglang_0_5_23


class StandInWorker(sglang_0_5_19.StandInWorker):
    @staticmethod
    def ngram_settings(scheduler: Any) -> Dict[str, Any]:
        return {"server_args": scheduler.server_args}


class RealScheduler(sglang_0_5_19.RealScheduler):
    worker_class = StandInWorker

    @property
    def decode_checkpoints_known_at_launch(self) -> bool:
        """0.5.16's and 0.5.17's result processing takes a decode's checkpoint length from the
        request's committed length, which under the overlap loop already counts the next,
        launched step (`_mamba_check_track_boundary`; 0.5.18 subtracts the lookahead)."""
        return Version(sglang_version()) < Version("0.5.18")

    @staticmethod
    def allow_the_extra_buffer_on_the_host() -> None:
        """0.5.16's .. 0.5.18's extra-buffer validation is `ServerArgs._validate_mamba_extra_buffer`
        (no `arg_groups.mamba_hook` yet), asking `is_cuda()` inline: while it validates,
        `server_args.is_cuda` says yes, and only there."""
        from sglang.srt import server_args

        sglang_0_5_23.answering_while_it_runs(
            server_args.ServerArgs, "_validate_mamba_extra_buffer", server_args, "is_cuda", lambda is_cuda: lambda: True
        )
