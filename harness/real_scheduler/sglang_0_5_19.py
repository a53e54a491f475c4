"""`RealScheduler` for SGLang 0.5.19: 0.5.20's, its loop taking in what arrived as 0.5.19's does
(`request_receiver.recv_requests()`, then `process_input_requests`; 0.5.20 folded both into
`ingest_requests`): a turn ends at the second `process_input_requests`; its model runner copies
a deferred copy-on-write in the Mamba pool itself (`mamba_pool.copy_from`)."""

from __future__ import annotations

from typing import Any

import torch

from harness.real_scheduler import sglang_0_5_20


class StandInWorker(sglang_0_5_20.StandInWorker):
    @staticmethod
    def copy_states(pool: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
        pool.mamba_pool.copy_from(src, dst)


class RealScheduler(sglang_0_5_20.RealScheduler):
    worker_class = StandInWorker
    INGEST = "process_input_requests"

    def ingest_now(self) -> None:
        scheduler = self.scheduler
        scheduler.process_input_requests(scheduler.request_receiver.recv_requests())
