"""`RealScheduler`: SGLang 0.5.23's own `Scheduler`, running on CPU in this process with a
stand-in model worker, one turn of its normal event loop at a time.

What is SGLang's and what is ours:
  SGLang's  `Scheduler.__init__` (server-args validation, the model config read from a tiny HF
            config of a hybrid architecture, `init_model_worker`, the memory pools' wiring, the
            tree cache it builds through `mem_cache/registry.py`), `event_loop_normal`, request
            ingestion (`TokenizedGenerateReqInput`, `AbortReq`, `FlushCacheReqInput` decoded
            from msgpack as the socket delivers them), the batch and result processing, and its
            invariant checker, strict (`SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE`,
            `..._DURING_BUSY`, `SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK`)
  ours      the seams 0.5.23 offers for this: `init_ipc_channels` (an inbox the program feeds,
            senders that drop), `init_tp_model_worker` (`StandInWorker`: the pools of the cache
            under test, `forward_batch_generation` writing digests and returning the tokens the
            program chose), `ingest_requests` (ends a turn at the loop's next ingest), the radix
            cache backend `harness` (`register_radix_cache_backend`) returning the cache under
            test's tree; NUMA thread binding and the scheduler's watchdog threads turned off
            (the harness shares the process, and pauses the loop between turns)

The stand-in forward pass checks, for every request of a batch, that the Mamba state it resumes
from is the digest of its own prefix (`harness.digest`), whatever the model says: a raise is an
`InvariantViolation("meaning", ...)`. A raise from SGLang's invariant checker is an
`InvariantViolation("sglang_self_check", ...)`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import socket
import tempfile
from array import array
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from harness import digest
from harness.caches.sglang_loader import load_sglang
from harness.checks.violation import InvariantViolation
from harness.operations import sampled_token
from harness.real_scheduler.host_kernels import run_paged_kernels_on_the_host
from harness.signature import normalize
from strategies.config import CacheConfig, SchedulerConfig

BACKEND = "harness"
# the tiny model's Mamba chunk (`mamba_chunk_size` in its HF config; 64 in Qwen3-Next, FLA's
# chunk): the extra buffer checkpoints on this grid, so programs of a few dozen tokens cross
# many checkpoints
MAMBA_CHUNK = 4
STRICT_CHECKS = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK": "1",
}
# the invariant checker's entry points the scheduler calls (scheduler_components/invariant_checker.py)
CHECKER_METHODS = ("_check_all_pools", "_report_leak", "_check_req_pool", "_check_tree_cache", "self_check_during_busy")


def tiny_hybrid_config(directory: str, context_len: int, eos_token_id: int) -> str:
    """Write a two-layer Qwen3-Next HF config (one linear-attention layer, one full-attention
    layer; `configs/qwen3_next.py` reads it) into `directory`; returns the directory."""
    config = {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 1024,
        "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "full_attention_interval": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 4,
        "linear_value_head_dim": 4, "linear_conv_kernel_dim": 2, "num_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "max_position_embeddings": context_len, "eos_token_id": eos_token_id, "torch_dtype": "float32",
        "mamba_chunk_size": MAMBA_CHUNK,
    }
    with open(os.path.join(directory, "config.json"), "w") as out:
        json.dump(config, out)
    return directory


# the cache under test of the scheduler being built: what the radix cache backend hands it
_BUILDING: Dict[str, Any] = {}
BUILD_TRIES = 3  # builds tried when the process group's port was taken meanwhile


class Computed(NamedTuple):
    """What the stand-in forward pass last computed for a request: positions `[0, length)` of
    the row in request slot `req_slot`, and the state in Mamba slot `mamba_slot`, that of its
    first `length` tokens."""

    req_slot: int
    mamba_slot: Optional[int]
    length: int


def _free_port() -> int:
    """A TCP port on loopback no one listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _digests(extra_key: Optional[str], tokens: Sequence[int], start: int) -> List[int]:
    return digest.digests(extra_key, tuple(tokens))


class TurnEnd(Exception):
    """The event loop reached its next ingest: one turn is over."""


class Inbox:
    """The scheduler's receive socket, fed by the program (`recv` gives msgpack, as zmq does)."""

    def __init__(self, io: Any, zmq: Any):
        self.queue: collections.deque = collections.deque()
        self._io, self._zmq = io, zmq

    def _next(self) -> Any:
        if not self.queue:
            raise self._zmq.ZMQError(self._zmq.EAGAIN, "no message")
        return self.queue.popleft()

    def recv(self, flags: int = 0) -> bytes:
        return self._io.msgpack_encode(self._next())

    def recv_pyobj(self, flags: int = 0) -> Any:
        return self._next()


class ModelRunnerStandIn(SimpleNamespace):
    """What the scheduler reads of `tp_worker.model_runner`; an attribute it was not given reads
    None (the features it names are off)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class StandInWorker:
    """The model worker: the cache under test's pools, and a forward pass that writes digests."""

    is_hybrid_swa = False
    weight_load_time = 0.0

    def __init__(self, owner: "RealScheduler", scheduler: Any):
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import NgramEmbeddingManager

        cut, config = owner.cut, owner.config
        self.owner = owner
        self.model_config = scheduler.model_config
        self.graph_time_usage: Dict[str, float] = {}
        self.model_runner = ModelRunnerStandIn(
            token_to_kv_pool=SimpleNamespace(size=config.kv_size, post_capture_active=False),
            mtp_draft_device_pools=(), mtp_draft_mamba_pools=(), model_config=scheduler.model_config,
            canary_manager=None, attn_backend=SimpleNamespace(needs_cpu_seq_lens=False),
            forward_stream=torch.cpu.Stream(), device=config.device, memory_pool_config=True,
            req_to_token_pool=cut.req_pool, token_to_kv_pool_allocator=cut.kv, prewarm_sampling=lambda: None,
        )
        self.model_runner.ngram_embedding_manager = NgramEmbeddingManager.from_model(
            model=None, model_config=scheduler.model_config, req_to_token_pool=cut.req_pool,
            max_running_requests=owner.max_running_requests, device=config.device, **self.ngram_settings(scheduler),
        )

    @staticmethod
    def ngram_settings(scheduler: Any) -> Dict[str, Any]:
        """What else the release's `NgramEmbeddingManager.from_model` takes (nothing from 0.5.19)."""
        return {}

    def get_memory_pool(self):
        return self.owner.cut.req_pool, self.owner.cut.kv

    def init_attention_backends(self) -> None:
        """No attention kernels: the forward pass writes digests."""

    def init_cuda_graphs(self) -> None:
        """No CUDA graphs on the stand-in."""

    def get_pad_input_ids_func(self) -> None:
        return None

    def get_worker_info(self) -> tuple:
        """`TpModelWorker.get_worker_info`'s 12-tuple, sized from the cache under test's pools."""
        config, sched = self.owner.config, self.owner.scheduler_config
        max_req_len = min(config.max_context_len - 1, config.kv_size - 1)
        return (
            config.kv_size, sched.max_prefill_tokens, self.owner.max_running_requests, None, max_req_len,
            max_req_len - 5, 0, config.device, self.model_runner.forward_stream,
            self.owner.cut.req_pool.size, self.owner.cut.req_pool.max_context_len, config.kv_size,
        )

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Compute each request's new positions (their KV slots get the digests of their
        prefixes, its Mamba state that of all it has processed), after the deferred Mamba
        clears and copies-on-write as `ModelRunner` makes them; returns the tokens the program
        chose for this turn. A resumed state is read as the batch found it, before any write."""
        from sglang.srt.managers.utils import GenerationBatchResult

        cut, extend = self.owner.cut, batch.forward_mode.is_extend()
        if extend:
            self._deferred_mamba_cow_and_clear(batch)
        computed = []
        decoded = None if extend else self._decoded(batch)
        for i, req in enumerate(batch.reqs):
            if extend:
                tokens = tuple(req.origin_input_ids) + tuple(req.output_ids)
                start, end = self.extend_range(req)
            else:
                tokens = decoded[i]
                start, end = len(tokens) - 1, len(tokens)
            computed.append((req, tokens, start, end, cut.mamba_slot_of(req)))
        if any(start > 0 for _, _, start, _, _ in computed):
            states = cut.state_digests()
            for req, tokens, start, _, slot in computed:
                if start > 0:
                    self._check_resumed_state(req, tokens, start, slot, states)
        checkpoints = self._checkpoints(batch, computed, extend)
        # (request, track slot, length) of each decode checkpoint: the scheduler learns of them
        # when it processes the batch's results (an extend's it planned when it built the batch)
        written = []
        for i, (req, tokens, start, end, slot) in enumerate(computed):
            if end > start:
                values = self.owner.record_digests(req.extra_key, tokens[:end], start)
                row = cut.req_pool.req_to_token[cut.req_slot_of(req), start:end].tolist()
                cut.write_kv(row, values[start:end])
                cut.write_state(slot, values[end - 1])
                if i in checkpoints:
                    track, length = checkpoints[i]
                    cut.write_state(track, values[length - 1])
                    self.owner.tracked[track] = (req.rid, length)
                    if extend:
                        self.owner.on_track(req, track, length)
                    else:
                        written.append((req, track, length))
            self.owner.computed[req.rid] = Computed(cut.req_slot_of(req), slot, max(end, start))
        next_tokens = [sampled_token(self.owner.sampled, i) for i in range(len(batch.reqs))]
        result = GenerationBatchResult(next_token_ids=torch.tensor(next_tokens, dtype=torch.int64), can_run_cuda_graph=False)
        self.owner.decode_checkpoints_written(result, written)
        return result

    @staticmethod
    def _decoded(batch: Any) -> List[Tuple[int, ...]]:
        """Per row of a decode batch, the tokens its sequence holds once the step's input is
        in: those the request records, up to the batch's seqlen less one, and the input token
        the batch carries (resolved from the future map: under the overlap loop the token the
        previous batch sampled is not yet in the request's output)."""
        out = []
        for req, seq_len, token in zip(batch.reqs, batch.seq_lens.tolist(), batch.input_ids.tolist()):
            known = tuple(req.origin_input_ids) + tuple(req.output_ids)
            if len(known) < seq_len - 1:
                raise RuntimeError(f"decode of request {req.rid} at seqlen {seq_len}: it records only {len(known)} tokens")
            out.append(known[: seq_len - 1] + (int(token),))
        return out

    def _checkpoints(self, batch: Any, computed: List[tuple], extend: bool) -> Dict[int, Tuple[int, int]]:
        """With the extra buffer, what the linear-attention backend checkpoints (0.5.23's
        `hybrid_linear_attn_backend._init_track_ssm_indices`, the gated-delta path), per row of
        the batch its mask selects: (track slot, how many tokens the state written there is
        of). On an extend, with `lens` the row's `mamba_track_seqlens` past its prefix: the
        extend's final state when `lens` is a whole number of chunks of `state_chunk_grid`,
        else the state after the last whole chunk of `lens` (the kernel's intermediate `h`);
        on a decode, the state after the step."""
        mask = getattr(batch, "mamba_track_mask", None)
        if mask is None or batch.mamba_track_indices is None:
            return {}
        chosen, slots = mask.tolist(), batch.mamba_track_indices.tolist()
        seqlens = batch.mamba_track_seqlens.tolist() if extend else None
        translate = self.owner.cut.req_pool.translate_mamba_indices
        grid = self.state_chunk_grid()
        out = {}
        for i, (_, _, start, end, _) in enumerate(computed):
            if not chosen[i] or slots[i] < 0:
                continue
            length = end
            if extend and (seqlens[i] - start) % grid:
                length = start + (seqlens[i] - start) // grid * grid
            out[i] = (int(translate(torch.tensor([slots[i]]))[0]), length)
        return out

    @staticmethod
    def state_chunk_grid() -> int:
        """The chunk grid the backend's checkpoint of an extend falls on (0.5.19 on: the
        model's `mamba_chunk_size`, `HybridLinearAttnBackend.mamba_chunk_size`)."""
        return MAMBA_CHUNK

    @staticmethod
    def extend_range(req: Any) -> Tuple[int, int]:
        """The positions an extend computes for the request: from its prefix to its extend's end."""
        return req.prefix_len, req.extend_end

    def _deferred_mamba_cow_and_clear(self, batch: Any) -> None:
        """What `ModelRunner` does before an extend (0.5.23's `model_runner.py`): zero the fresh
        slots the batch collected (`mamba_clear_indices`), copy each matched state into its
        request's slot (`mamba_cow_src_indices` -> `mamba_cow_dst_indices`)."""
        pool = self.owner.cut.req_pool
        clear = getattr(batch, "mamba_clear_indices", None)
        if clear is not None and len(clear) > 0:
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(clear))
            self._forget_checkpoints(pool.translate_mamba_indices(clear))
        src = getattr(batch, "mamba_cow_src_indices", None)
        if src is not None and len(src) > 0:
            dst = pool.translate_mamba_indices(batch.mamba_cow_dst_indices)
            self.copy_states(pool, pool.translate_mamba_indices(src), dst)
            self._forget_checkpoints(dst)

    def _forget_checkpoints(self, slots: torch.Tensor) -> None:
        """Slots just cleared or copied into hold no checkpoint any more."""
        for slot in slots.reshape(-1).tolist():
            self.owner.tracked.pop(int(slot), None)

    @staticmethod
    def copy_states(pool: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the Mamba states of (physical) slots `src` into `dst`, as the model runner does."""
        pool.copy_mamba_state(src, dst)

    def _check_resumed_state(self, req: Any, tokens: tuple, start: int, slot: Optional[int], states: List[Optional[int]]) -> None:
        """The state request `req` resumes from (`states`: the digest each slot holds) is that
        of its first `start` tokens."""
        want = digest.digest(req.extra_key, tokens[:start])
        got = None if slot is None else states[slot]
        if got != want:
            raise InvariantViolation(
                "meaning",
                f"forward pass of request {req.rid}: it resumes after {start} tokens from Mamba slot {slot}, "
                f"which holds {got}, not the digest of {list(tokens[:start])} ({want})",
                "resumed Mamba state",
            )


def _each_once(reqs: Sequence[Any]) -> List[Any]:
    """`reqs` without None and without repeats, in order."""
    found: Dict[int, Any] = {}
    for req in reqs:
        if req is not None:
            found.setdefault(id(req), req)
    return list(found.values())


def answering_while_it_runs(owner: Any, method: str, module: Any, name: str, answer: Callable[[Any], Any]) -> None:
    """Make `owner.method` (a function or a class's method) see `module.name` replaced by
    `answer(the original)` while it runs, and only then; done once per process."""
    run = getattr(owner, method)
    if getattr(run, "__wrapped__", None) is not None:
        return
    original = getattr(module, name)

    def answered(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, answer(original))
        try:
            return run(*args, **kwargs)
        finally:
            setattr(module, name, original)

    answered.__wrapped__ = run
    setattr(owner, method, answered)


@contextlib.contextmanager
def pinning_on_the_host(device: str) -> Iterator[None]:
    """On a CPU-only machine, `Tensor.pin_memory()` leaves a tensor as it is and
    `torch.tensor(..., pin_memory=True)` builds it unpinned (torch raises: there is no
    accelerator to pin for): the extra buffer's bookkeeping pins its track mask
    unconditionally (0.5.23's `ScheduleBatch.prepare_for_decode`) and its track positions
    (0.5.22's `set_mamba_track_indices_from_reqs`)."""
    if device != "cpu" or torch.accelerator.is_available():
        yield
        return
    pin, make = torch.Tensor.pin_memory, torch.tensor

    def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return make(*args, **kwargs)

    torch.Tensor.pin_memory, torch.tensor = (lambda tensor, *args, **kwargs: tensor), unpinned
    try:
        yield
    finally:
        torch.Tensor.pin_memory, torch.tensor = pin, make


def _named_checker_class(base: type) -> type:
    """`base` with each of `CHECKER_METHODS` raising `InvariantViolation("sglang_self_check")`
    where it raised an `AssertionError` or a `ValueError`."""

    def named(name: str) -> Any:
        method = getattr(base, name)

        def check(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except InvariantViolation:
                raise
            except (AssertionError, ValueError) as exc:
                raise InvariantViolation("sglang_self_check", f"{name}: {exc}", normalize(str(exc))) from exc

        return check

    return type(f"Named{base.__name__}", (base,), {"__slots__": (), **{name: named(name) for name in CHECKER_METHODS}})


class RealScheduler:
    """SGLang 0.5.23's `Scheduler` over a cache under test (an `SglangUnified0522Cache`), built once;
    `arrive`, `abort` and `flush` send what the tokenizer would, `turn` runs one turn of
    `event_loop_normal` (see the module docstring)."""

    worker_class = StandInWorker
    # the loop's call that takes in what arrived: a turn ends at its second call
    INGEST = "ingest_requests"

    def __init__(self, cut: Any, config: CacheConfig, scheduler_config: SchedulerConfig = SchedulerConfig()):
        if scheduler_config.disaggregation_mode != "null":
            raise ValueError(f"the real scheduler runs disaggregation_mode 'null' only, got {scheduler_config.disaggregation_mode!r}")
        os.environ.update(STRICT_CHECKS)
        load_sglang()
        import zmq
        import sglang.srt.managers.scheduler as scheduler_module
        from sglang.srt import runtime_context
        from sglang.srt.distributed import bootstrap
        from sglang.srt.managers import io_struct
        from sglang.srt.managers.scheduler_components.ipc_channels import SchedulerIpcChannels
        from sglang.srt.managers.scheduler_components.output_sender import SenderWrapper
        from sglang.srt.mem_cache import registry
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import PortArgs, ServerArgs

        self.cut, self.config, self.scheduler_config = cut, config, scheduler_config
        self.io, self.SamplingParams = io_struct, SamplingParams
        self.sampled: List[int] = []
        self.computed: Dict[str, Computed] = {}  # per rid, what the forward pass last computed
        # per track slot, the checkpoint the forward pass last wrote there (the extra buffer),
        # and who is told of each once the scheduler knows of it (`ModelMirror.record_track`:
        # an extend's at launch, a decode's as its results are processed, from 0.5.18)
        self.tracked: Dict[int, Tuple[str, int]] = {}  # slot -> (rid, how many tokens it is of)
        self.on_track: Callable[[Any, int, int], None] = lambda req, slot, length: None
        # the digest of every prefix of a request's tokens, those from a position on about to be
        # written (a protocol records what they are of: `PairedCaches.record_digests`)
        self.record_digests: Callable[[Optional[str], Sequence[int], int], List[int]] = _digests
        self.inbox = Inbox(io_struct, zmq)
        if BACKEND not in registry.registered_radix_cache_backends():  # once per process
            registry.register_radix_cache_backend(BACKEND, lambda context: _BUILDING["cut"].cache)
        _BUILDING["cut"] = cut
        bootstrap._bind_threads_if_cpu = lambda device: None  # NUMA pinning would pin the whole harness
        self._model_dir = tempfile.TemporaryDirectory(prefix="harness-model-")  # removed with the scheduler
        model_path = tiny_hybrid_config(self._model_dir.name, config.max_context_len, scheduler_config.eos_token_id)
        settings = self.server_settings(model_path)
        owner, inbox = self, self.inbox

        class HarnessScheduler(scheduler_module.Scheduler):
            # `event_loop_overlap` starts with a new result queue: each turn re-enters the
            # loop, so the queue the previous turn left (the batch launched, its results not
            # yet processed) is kept, and the loop's fresh one dropped; a message the harness
            # hands in before the first turn (a flush asking whether the loop is idle) finds
            # the queue the loop would start with, empty
            @property
            def result_queue(self) -> Any:
                if not hasattr(self, "_harness_result_queue"):
                    self._harness_result_queue = collections.deque()
                return self._harness_result_queue

            @result_queue.setter
            def result_queue(self, queue: Any) -> None:
                """The loop's fresh queue: dropped (the kept one is as empty at the start)."""

            def init_ipc_channels(self, port_args: Any) -> None:
                empty = Inbox(io_struct, zmq)
                self.ipc_channels = SchedulerIpcChannels(
                    recv_from_tokenizer=inbox, recv_from_rpc=empty, send_to_tokenizer=SenderWrapper(None),
                    send_to_detokenizer=SenderWrapper(None), send_metrics_from_scheduler=None,
                )
                self.recv_from_tokenizer = inbox
                self.load_snapshot_writer = None

            def init_tp_model_worker(self) -> None:
                self.tp_worker = owner.worker_class(owner, self)

            def process_batch_result(self, batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
                # the checkpoints a decode batch's forward pass wrote are the scheduler's to
                # know from when it processes the batch's results (`mamba_last_track_seqlen`
                # set there; under the overlap loop after the next batch is launched)
                for req, slot, length in owner.decode_checkpoints_learned(batch, result):
                    owner.on_track(req, slot, length)
                return super().process_batch_result(batch, result, *args, **kwargs)

        ingest = getattr(scheduler_module.Scheduler, self.INGEST)

        def ingest_once_a_turn(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            self._ingests += 1
            if self._ingests > 1:
                raise TurnEnd()
            return ingest(scheduler, *args, **kwargs)

        setattr(HarnessScheduler, self.INGEST, ingest_once_a_turn)
        self._ingests = 0
        # no watchdog threads: one SIGQUITs the *parent* process (a shell, pytest's controller)
        # once the forward count stands still for `--watchdog-timeout` with a batch on, and the
        # harness leaves a scheduler between programs as long as it likes
        make_watchdog = scheduler_module.create_scheduler_watchdog
        scheduler_module.create_scheduler_watchdog = lambda *args, **kwargs: None
        try:
            if config.mamba_strategy != "no_buffer":
                self.allow_the_extra_buffer_on_the_host()
            if config.page_size > 1:
                run_paged_kernels_on_the_host(config.device)
            for attempt in range(BUILD_TRIES):
                # the process groups are built once per process: an earlier build's go first
                if getattr(bootstrap, "_PARALLEL_INITIALISED", False) or torch.distributed.is_initialized():
                    from sglang.srt.distributed import parallel_state

                    parallel_state.destroy_model_parallel()
                    parallel_state.destroy_distributed_environment()
                # the gloo group's port: another process of a parallel run may take it first
                server_args = ServerArgs(nccl_port=_free_port(), **settings)
                self.publish(runtime_context, server_args)
                try:
                    self.scheduler = self.construct(HarnessScheduler, server_args, PortArgs.init_new(server_args))
                    break
                except torch.distributed.DistNetworkError:
                    if attempt == BUILD_TRIES - 1:
                        raise
        finally:
            scheduler_module.create_scheduler_watchdog = make_watchdog
            del _BUILDING["cut"]
        self._name_checker_failures()

    @staticmethod
    def allow_the_extra_buffer_on_the_host() -> None:
        """Server-args validation refuses the extra buffer on the CPU platform
        (`arg_groups/mamba_hook.py:_platform_supports_mamba_cache_extra_buffer`: CUDA, MUSA, NPU,
        HIP, XPU), though its pools, tree and bookkeeping run on the host: the harness says the
        platform takes it (the kernel's checkpoint writes are the stand-in worker's)."""
        from sglang.srt.arg_groups import mamba_hook

        mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True

    def server_settings(self, model_path: str) -> Dict[str, Any]:
        """The server's command line: the tiny model, no tokenizer, the pools' sizes and the
        scheduling settings of the configuration, the cache under test as the radix backend."""
        config, sched = self.config, self.scheduler_config
        chunk = sched.chunked_prefill_size
        tracking = {"mamba_track_interval": sched.mamba_track_interval} if config.mamba_strategy != "no_buffer" else {}
        return dict(
            model_path=model_path, device=config.device, skip_tokenizer_init=True, load_format="dummy",
            disable_overlap_schedule=config.event_loop != "overlap", mamba_radix_cache_strategy=config.mamba_strategy, page_size=config.page_size,
            **tracking,
            max_running_requests=self.max_running_requests,
            max_total_tokens=config.kv_size, chunked_prefill_size=-1 if chunk is None else chunk,
            max_prefill_tokens=sched.max_prefill_tokens, schedule_policy=sched.schedule_policy,
            schedule_conservativeness=sched.schedule_conservativeness, disable_cuda_graph=True,
            radix_cache_backend=BACKEND, context_length=config.max_context_len,
        )

    @staticmethod
    def publish(runtime_context: Any, server_args: Any) -> None:
        """Install the server settings process-wide, as the scheduler process of rank 0 does."""
        runtime_context.publish(server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))

    @staticmethod
    def construct(scheduler_class: type, server_args: Any, port_args: Any) -> Any:
        """The scheduler of rank 0 (its ranks read from the published settings)."""
        return scheduler_class(server_args, port_args)

    @staticmethod
    def decode_checkpoints_written(result: Any, written: List[Tuple[Any, int, int]]) -> None:
        """A decode batch's forward pass wrote these checkpoints (request, track slot, length)."""
        result.harness_checkpoints = written

    @staticmethod
    def decode_checkpoints_learned(batch: Any, result: Any) -> List[Tuple[Any, int, int]]:
        """The checkpoints the scheduler learns of processing `batch`'s results: those its own
        forward pass wrote (`mamba_last_track_seqlen` set there, 0.5.18 on)."""
        return list(getattr(result, "harness_checkpoints", ()))

    @property
    def max_running_requests(self) -> int:
        """The server's `--max-running-requests`: the setting's, else the request pool's size."""
        return self.scheduler_config.max_running_requests or self.config.req_size

    def _name_checker_failures(self) -> None:
        """A raise from SGLang's invariant checker is the check `sglang_self_check` (its class is
        slotted: the instance moves to a subclass whose entry points name the failure)."""
        checker = self.scheduler.invariant_checker
        checker.__class__ = _named_checker_class(type(checker))

    # ----- what the tokenizer sends -----------------------------------------------------------

    def arrive(self, rid: str, tokens: Sequence[int], extra_key: Optional[str], max_new_tokens: int) -> None:
        """A `TokenizedGenerateReqInput`, received at once (the loop's next ingest would), its
        sampling parameters normalized as the tokenizer manager normalizes them (no tokenizer)."""
        sampling = self.SamplingParams(max_new_tokens=max_new_tokens)
        sampling.normalize(None)
        self._send(self.io.TokenizedGenerateReqInput(
            rid=rid, input_text="", input_ids=array("q", tokens), mm_inputs=None, token_type_ids=None,
            sampling_params=sampling, return_logprob=False,
            logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False, input_embeds=None,
            extra_key=extra_key,
        ))

    def abort(self, rid: str) -> None:
        self._send(self.io.AbortReq(rid=rid))

    def flush(self) -> None:
        self._send(self.io.FlushCacheReqInput())

    def _send(self, message: Any) -> None:
        self.inbox.queue.append(message)
        self._ingests = 0
        self.ingest_now()

    def ingest_now(self) -> None:
        """What the loop does with the socket at the top of a turn, done at once."""
        self.scheduler.ingest_requests()

    # ----- the event loop ---------------------------------------------------------------------

    def turn(self, sampled: Sequence[int] = ()) -> None:
        """One turn of `event_loop_normal`: the forward pass samples `sampled[i % len]` for the
        i-th request of its batch (0 when empty)."""
        self.sampled = list(sampled)
        self._ingests = 0
        # only the extra buffer's bookkeeping pins memory
        pinning = pinning_on_the_host(self.config.device) if self.config.mamba_strategy != "no_buffer" else contextlib.nullcontext()
        try:
            with pinning:
                self.loop()
        except TurnEnd:
            pass

    def loop(self) -> None:
        """Enter the event loop as the scheduler process does (`run_event_loop`: the schedule
        stream, then the loop the server settings pick); the turn ends at its next ingest."""
        self.scheduler.run_event_loop()

    def restart_counters(self) -> None:
        """What a fresh build starts from, for the next program: the scheduler's new-token
        ratio and forward count, and no record of what the forward pass computed."""
        self.scheduler.new_token_ratio_tracker.reset()
        self.scheduler.forward_ct = 0
        self.computed.clear()
        self.tracked.clear()

    # ----- reading the scheduler between turns ------------------------------------------------

    def computed_len(self, req: Any) -> int:
        """How many positions of the request's row the forward pass computed (0 for a row it
        has not computed in since the request took it)."""
        done = self.computed.get(req.rid)
        return done.length if done is not None and done.req_slot == self.cut.req_slot_of(req) else 0

    def state_len(self, req: Any) -> Optional[int]:
        """How many tokens the request's Mamba state was computed from, when the forward pass
        computed it in the slot the request holds now (None: it cannot say)."""
        done = self.computed.get(req.rid)
        slot = self.cut.mamba_slot_of(req)
        return done.length if done is not None and slot is not None and done.mamba_slot == slot else None

    def track_len(self, req: Any, slot: int) -> Optional[int]:
        """How many tokens the checkpoint in the request's track slot `slot` is of, when the
        forward pass wrote it there for this request (None otherwise)."""
        rid, length = self.tracked.get(slot, (None, None))
        return length if rid == req.rid else None

    def scheduled_requests(self) -> List[Any]:
        """Every request the scheduler schedules from (waiting, running, being chunked, in the
        last batch, a batch's record of the request it chunked), each once, finished or not."""
        s = self.scheduler
        batches = [b for b in (s.running_batch, s.last_batch) if b is not None]
        return _each_once(list(s.waiting_queue) + [r for b in batches for r in (*b.reqs, b.chunked_req)] + [s.chunked_req])

    def held_requests(self) -> List[Any]:
        """Every request the scheduler still refers to: those it schedules from and those of the
        overlap loop's record of its last two launched batches (`record_batch_in_overlap` pins
        each batch, with its fields as launched, for two turns so that the forward stream's
        tensors outlive it: their finished requests, and the nodes they name, live as long)."""
        recorded = []
        for record in getattr(self.scheduler, "batch_record_buf", None) or ():
            if record is None:
                continue
            batch, launched = record
            fields = dict(zip((f.name for f in dataclasses.fields(batch)), launched))
            recorded += [*(fields.get("reqs") or ()), fields.get("chunked_req")]
        return _each_once(self.scheduled_requests() + recorded)

    def live_requests(self) -> List[Any]:
        """The scheduler's requests not yet released: waiting, running, being chunked, or in the
        last prefill batch not yet merged, each once. A finished request whose KV is released
        holds nothing (the Mamba slot it still names is the one it gave the tree), though it
        stays in the running batch until the next turn filters it out."""
        return [req for req in self.scheduled_requests() if not (req.finished() and self.cut.kv_released(req))]
