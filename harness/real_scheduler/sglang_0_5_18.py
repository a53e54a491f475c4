"""`RealScheduler` for SGLang 0.5.17 and 0.5.18: 0.5.19's, with the server settings handed to
the model runner's n-gram embedding manager (`NgramEmbeddingManager.from_model(server_args=...)`;
0.5.19 reads them from the runtime context), their extra-buffer validation opened on the host as
`ServerArgs` runs it, their backend's checkpoint grid the larger of the Mamba chunk and the page. Their requests keep their slots on themselves
(`req.req_pool_idx`, `req.mamba_pool_idx`, `req.kv` only the allocated length): the cache
adapter of their era reads them (`harness.caches.sglang_unified_0_5_17`)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from packaging.version import Version

from harness.caches.sglang_loader import sglang_version
from harness.real_scheduler import sglang_0_5_19, sglang_0_5_23


class StandInWorker(sglang_0_5_19.StandInWorker):
    @staticmethod
    def ngram_settings(scheduler: Any) -> Dict[str, Any]:
        return {"server_args": scheduler.server_args}

    @staticmethod
    def state_chunk_grid() -> int:
        """0.5.16 .. 0.5.18's backend checkpoints an extend on the grid of
        `mamba_cache_chunk_size`, the larger of the model's Mamba chunk and the page (0.5.19 on:
        the model's chunk alone), read from the release as its `_init_track_ssm_indices` reads it."""
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as backend

        if hasattr(backend, "mamba_cache_chunk_size"):
            return backend.mamba_cache_chunk_size()
        return backend.get_server_args().mamba_cache_chunk_size


class RealScheduler(sglang_0_5_19.RealScheduler):
    worker_class = StandInWorker

    def __init__(self, *args: Any, **kwargs: Any):
        # 0.5.16, 0.5.17: the decode checkpoints written, not yet learned of
        self._unlearned: List[Tuple[Any, int, int]] = []
        super().__init__(*args, **kwargs)

    @property
    def learns_by_committed_length(self) -> bool:
        """0.5.16's and 0.5.17's result processing takes a decode's checkpoint length from the
        request's committed length (`_mamba_check_track_boundary`), which under the overlap
        loop already counts the next, launched step (0.5.18 subtracts the lookahead)."""
        return Version(sglang_version()) < Version("0.5.18")

    def decode_checkpoints_written(self, result: Any, written: List[Tuple[Any, int, int]]) -> None:
        if self.learns_by_committed_length:
            self._unlearned.extend(written)
        else:
            super().decode_checkpoints_written(result, written)

    def decode_checkpoints_learned(self, batch: Any, result: Any) -> List[Tuple[Any, int, int]]:
        """0.5.16, 0.5.17: processing a decode batch, each of its requests learns of the
        checkpoint at its committed length, whichever launched batch wrote it (one launched
        right after an extend is learned of at the request's next decode result, if any)."""
        if not self.learns_by_committed_length:
            return super().decode_checkpoints_learned(batch, result)
        if not batch.forward_mode.is_decode():
            return []
        committed = {req.rid: req.kv_committed_len for req in batch.reqs}
        learned = [c for c in self._unlearned if committed.get(c[0].rid) == c[2]]
        self._unlearned = [c for c in self._unlearned if c[0].rid not in committed or c[2] > committed[c[0].rid]]
        return learned

    def restart_counters(self) -> None:
        super().restart_counters()
        self._unlearned.clear()

    @staticmethod
    def allow_the_extra_buffer_on_the_host() -> None:
        """0.5.16's .. 0.5.18's extra-buffer validation is `ServerArgs._validate_mamba_extra_buffer`
        (no `arg_groups.mamba_hook` yet), asking `is_cuda()` inline: while it validates,
        `server_args.is_cuda` says yes, and only there."""
        from sglang.srt import server_args

        sglang_0_5_23.answering_while_it_runs(
            server_args.ServerArgs, "_validate_mamba_extra_buffer", server_args, "is_cuda", lambda is_cuda: lambda: True
        )
