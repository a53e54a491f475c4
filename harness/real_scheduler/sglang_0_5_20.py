"""`RealScheduler` for SGLang 0.5.20: 0.5.21's, with what 0.5.20 leaves to the model runner or
takes otherwise: the process groups are set up by the model worker (`ModelRunner` calls
`distributed/bootstrap.init_torch_distributed`; 0.5.21 moved it into the scheduler's
`init_parallel_runtime`), `runtime_context.publish` takes the role alone (no spawn ranks), and
`Scheduler` is given the ranks of a one-GPU server as arguments."""

from __future__ import annotations

from typing import Any

from harness.real_scheduler import sglang_0_5_21


class StandInWorker(sglang_0_5_21.StandInWorker):
    def __init__(self, owner: Any, scheduler: Any):
        from sglang.srt.distributed import bootstrap

        bootstrap.init_torch_distributed(
            server_args=scheduler.server_args, model_config=scheduler.model_config, device=owner.config.device,
            ps=scheduler.ps, dist_port=scheduler.nccl_port, is_draft_worker=False, local_omp_cpuid=None,
        )
        super().__init__(owner, scheduler)


class RealScheduler(sglang_0_5_21.RealScheduler):
    worker_class = StandInWorker

    @staticmethod
    def publish(runtime_context: Any, server_args: Any) -> None:
        runtime_context.publish(server_args, role="scheduler")

    @staticmethod
    def construct(scheduler_class: type, server_args: Any, port_args: Any) -> Any:
        return scheduler_class(server_args, port_args, gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0, attn_cp_rank=0, moe_dp_rank=0, dp_rank=None)
