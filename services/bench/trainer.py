"""`rlrun bench trainer`: the trainer against bare torch, one torch thread.

1. Step throughput. The same model (configs/models/tiny-d64.json), the same packed tokens (a
   demo-shaped batch: 16 prompts x 8 completions), the same AdamW:
   - (a) a bare torch loop: forward over the packed tokens, an advantage-weighted NLL on the
     completion tokens, backward, optimizer step, and nothing else;
   - (b) the trainer's train step (packing, the channel loss with its statistics, gradient
     clipping, the non-finite check, the schedule);
   - (c) the same step through the service: SubmitBatch over gRPC on 127.0.0.1 (proto decoding
     and validation included; no replicas).
   Ratios a/b (`ratio_vs_bare_loop`, target >= 0.9) and a/c. The three run in turn, each
   iteration's ratio compares neighbouring runs (so load from other processes hits both sides
   alike), and every figure is a median over iterations.
2. Broadcast throughput, into the same in-process sink that only counts bytes. The trainer's
   gRPC weight broadcast (tensors to header and chunks, checksum included, then the UpdateWeights
   stream) against a raw UpdateWeights stream of the same bytes: a client holding the weight
   bytes in one buffer, cutting 4 MiB chunk messages as it streams (`broadcast_ratio_vs_raw`,
   target >= 0.8); and, stricter, against streaming already built messages
   (`broadcast_ratio_vs_prebuilt`). The model is a 25 MB Llama (6.3M parameters; 3 MB
   tiny-d128 with --quick).
3. LoRA against full fine-tuning of that same model (`[trainer.lora]` at its defaults: rank 8
   on every linear layer of the decoder layers): the bytes and time of one gRPC sync into the
   same sink (only the adapters travel: `lora_sync_bytes_ratio`, full / LoRA), and AdamW's
   state after a step (`lora_optimizer_bytes_ratio`).

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlrun.bench import emit_result
from rlrun.common import builtin
from rlrun.common.config.trainer import BroadcastConfig, LoraConfig, TrainerConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.model import ArchConfig, CausalLM, PackedCausal, build_model, create_model
from rlrun.common.model.lora import apply_lora
from rlrun.common.weights.grpc_stream import GrpcWeightBroadcaster, build_header, iter_update_messages
from rlrun.common.weights.protocol import broadcast_tensors, total_bytes
from rlrun.common.wire.inference import SERVICE_NAME as INFERENCE
from rlrun.common.wire.inference import WeightsApplied, weights_applied_from_proto, weights_applied_to_proto
from rlrun.common.wire.trainer import SubmitBatch, step_result_from_proto, submit_request_to_proto
from rlrun.common.wire.training import TrainingBatch, encode_batch
from rlrun.common.wire.weights import (
    WeightChunk,
    WeightUpdateHeader,
    update_message_from_proto,
    update_messages,
)
from rlrun.trainer.app import add_trainer_service, create_runtime
from rlrun.trainer.coordinator import Coordinator
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.loss import token_logprobs
from rlrun.trainer.optim import build_optimizer
from rlrun.trainer.packing import pack_micro_batch
from rlrun.trainer.servicer import SERVICE_NAME
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config
from rlrun.v1 import inference_pb2_grpc, trainer_pb2_grpc

PROMPTS, GROUP = 16, 8
# A 25 MB model for the broadcast: enough bytes that the stream, not per-call overhead, dominates.
BROADCAST_ARCH = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
}


def paired_ratio(baseline: list[float], measured: list[float]) -> float:
    """Median over iterations of baseline time / measured time (throughput relative to the baseline)."""
    return statistics.median(b / m for b, m in zip(baseline, measured, strict=True))


def demo_batch(step: int) -> TrainingBatch:
    """Reverse-text shaped: ~12-token prompts, up to 10 sampled tokens, 128 samples."""
    return synthetic_batch(step, num_samples=PROMPTS * GROUP, prompt_len=(10, 14), completion_len=(4, 10))


# -- 1. step throughput --------------------------------------------------------------------


class BareLoop:
    """The baseline: the model, packed tokens and AdamW with no trainer around them."""

    def __init__(self, config, batch: TrainingBatch):
        self.model = build_model(config.model, device=config.trainer.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.trainer.lr)
        self.packed = pack_micro_batch(batch.samples).to(config.trainer.device)
        self.attend = PackedCausal.from_offsets(self.packed.cu_seqlens)
        self.weights = self.packed.advantages * self.packed.rl_mask
        self.count = int(self.packed.rl_mask.sum())

    def step(self) -> None:
        p = self.packed
        logits = self.model(p.input_ids, p.positions, self.attend)
        logprobs, _ = token_logprobs(logits[p.predict_rows], p.targets, p.temperatures)
        loss = -(logprobs * self.weights).sum() / self.count
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


async def start_trainer_server(config) -> tuple[GrpcServer, object, int]:
    learner = build_learner(config, Parallelism.single())
    runtime = create_runtime(config, Coordinator(learner, None), ClientOptions())
    server = GrpcServer(ServerOptions(shutdown_grace_s=0), [SERVICE_NAME])
    add_trainer_service(server.server, runtime, config)
    port = await server.start()
    server.set_serving(True)
    return server, runtime, port


async def measure_steps(iterations: int, output_dir: Path) -> dict:
    config = synthetic_config(output_dir)
    batch = demo_batch(0)
    bare = BareLoop(config, batch)
    learner = build_learner(config, Parallelism.single())
    server, runtime, port = await start_trainer_server(config)
    bare_s, step_s, service_s = [], [], []
    try:
        async with open_channel(f"127.0.0.1:{port}", ClientOptions(deadline_s=120)) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            for i in range(iterations + 2):  # the first two warm up
                started = time.perf_counter()
                bare.step()
                bare_time = time.perf_counter() - started
                batch.step = learner.step
                started = time.perf_counter()
                learner.train(batch)
                step_time = time.perf_counter() - started
                batch.step = runtime.step
                request = submit_request_to_proto(
                    SubmitBatch(encode_batch(batch.samples), batch.step, batch.policy_version)
                )
                started = time.perf_counter()
                step_result_from_proto(await stub.SubmitBatch(request))
                service_time = time.perf_counter() - started
                if i >= 2:
                    bare_s.append(bare_time)
                    step_s.append(step_time)
                    service_s.append(service_time)
    finally:
        await runtime.broadcaster.close()
        await server.stop(0)
    bare_ms, step_ms, service_ms = (statistics.median(x) * 1e3 for x in (bare_s, step_s, service_s))
    tokens = sum(len(s.token_ids) for s in batch.samples)
    return {
        "tokens_per_step": tokens,
        "bare_step_ms": bare_ms,
        "trainer_step_ms": step_ms,
        "service_step_ms": service_ms,
        "trainer_tokens_per_s": tokens / step_ms * 1e3,
        "ratio_vs_bare_loop": paired_ratio(bare_s, step_s),
        "service_ratio_vs_bare_loop": paired_ratio(bare_s, service_s),
    }


# -- 2. broadcast throughput ---------------------------------------------------------------


class CountingSink(inference_pb2_grpc.InferenceServiceServicer):
    """Receives UpdateWeights streams and only counts their bytes."""

    async def UpdateWeights(self, request_iterator, context):
        received = 0
        version = 0
        async for message in request_iterator:
            part = update_message_from_proto(message)
            if isinstance(part, WeightUpdateHeader):
                version = part.version
            elif part is not None:
                received += len(part.data)
        return weights_applied_to_proto(WeightsApplied(version, received))


def broadcast_model(quick: bool) -> CausalLM:
    if quick:
        arch = ArchConfig.from_file(builtin.model_config("tiny-d128"))
    else:
        arch = ArchConfig.from_dict(BROADCAST_ARCH)
    model = create_model(arch)
    model.init_weights(0)
    return model


async def start_sink() -> tuple[GrpcServer, str]:
    server = GrpcServer(ServerOptions(shutdown_grace_s=0), [INFERENCE])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(CountingSink(), server.server)
    port = await server.start()
    return server, f"127.0.0.1:{port}"


def raw_stream(header: WeightUpdateHeader, data: bytes, chunk_bytes: int):
    """The raw client: a header, then the bytes cut into chunk messages on the fly."""
    chunks = (
        WeightChunk(header.version, index, data[offset : offset + chunk_bytes])
        for index, offset in enumerate(range(0, len(data), chunk_bytes))
    )
    return update_messages(header, chunks)


async def measure_broadcast(iterations: int, quick: bool) -> dict:
    tensors = broadcast_tensors(broadcast_model(quick))
    settings = BroadcastConfig()
    chunk_bytes = int(settings.chunk_mb * 2**20)
    header, buffers = build_header(tensors, 0)
    data = b"".join(buffers)
    prebuilt = list(iter_update_messages(tensors, 0, chunk_bytes))
    server, address = await start_sink()
    broadcaster = GrpcWeightBroadcaster([address], settings, ClientOptions())
    raw_s, prebuilt_s, trainer_s = [], [], []
    try:
        async with open_channel(address, ClientOptions(deadline_s=120)) as channel:
            raw = inference_pb2_grpc.InferenceServiceStub(channel)
            for i in range(iterations + 1):  # the first warms up
                started = time.perf_counter()
                reply = weights_applied_from_proto(
                    await raw.UpdateWeights(raw_stream(header, data, chunk_bytes))
                )
                raw_time = time.perf_counter() - started
                assert reply.bytes_received == len(data)
                started = time.perf_counter()
                await raw.UpdateWeights(iter(prebuilt))
                prebuilt_time = time.perf_counter() - started
                started = time.perf_counter()
                results = await broadcaster.broadcast(tensors, i + 1)
                trainer_time = time.perf_counter() - started
                if not results[0].ok:
                    raise RuntimeError(f"broadcast to the sink failed: {results[0].error}")
                if i >= 1:
                    raw_s.append(raw_time)
                    prebuilt_s.append(prebuilt_time)
                    trainer_s.append(trainer_time)
    finally:
        await broadcaster.close()
        await server.stop(0)
    raw_ms, prebuilt_ms, trainer_ms = (statistics.median(x) * 1e3 for x in (raw_s, prebuilt_s, trainer_s))
    mib = len(data) / 2**20
    return {
        "broadcast_bytes": len(data),
        "broadcast_ms": trainer_ms,
        "raw_stream_ms": raw_ms,
        "prebuilt_stream_ms": prebuilt_ms,
        "broadcast_mib_per_s": mib / trainer_ms * 1e3,
        "raw_stream_mib_per_s": mib / raw_ms * 1e3,
        "broadcast_ratio_vs_raw": paired_ratio(raw_s, trainer_s),
        "broadcast_ratio_vs_prebuilt": paired_ratio(prebuilt_s, trainer_s),
    }


# -- 3. LoRA against full fine-tuning -------------------------------------------------------


def adamw_state_bytes(model: CausalLM) -> int:
    """AdamW's state after one step over what trains (zero gradients: the size is the same)."""
    optimizer = build_optimizer(model, TrainerConfig())
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


async def measure_lora(iterations: int, quick: bool) -> dict:
    full_model, lora_model = broadcast_model(quick), broadcast_model(quick)
    apply_lora(lora_model, LoraConfig(), seed=0)
    full, lora = broadcast_tensors(full_model), broadcast_tensors(lora_model)
    server, address = await start_sink()
    broadcaster = GrpcWeightBroadcaster([address], BroadcastConfig(), ClientOptions())
    times: dict[str, list[float]] = {"full": [], "lora": []}
    try:
        for i in range(iterations + 1):  # the first warms up
            for kind, tensors in (("full", full), ("lora", lora)):
                started = time.perf_counter()
                (result,) = await broadcaster.broadcast(tensors, 2 * i + (kind == "lora"))
                if not result.ok:
                    raise RuntimeError(f"broadcast to the sink failed: {result.error}")
                if i >= 1:
                    times[kind].append(time.perf_counter() - started)
    finally:
        await broadcaster.close()
        await server.stop(0)
    full_bytes, lora_bytes = total_bytes(full), total_bytes(lora)
    full_state, lora_state = adamw_state_bytes(full_model), adamw_state_bytes(lora_model)
    return {
        "lora_rank": LoraConfig().rank,
        "full_sync_bytes": full_bytes,
        "lora_sync_bytes": lora_bytes,
        "lora_sync_bytes_ratio": full_bytes / lora_bytes,
        "full_sync_ms": statistics.median(times["full"]) * 1e3,
        "lora_sync_ms": statistics.median(times["lora"]) * 1e3,
        "lora_sync_time_ratio": paired_ratio(times["full"], times["lora"]),
        "full_optimizer_bytes": full_state,
        "lora_optimizer_bytes": lora_state,
        "lora_optimizer_bytes_ratio": full_state / lora_state,
    }


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    quick = bool(args.quick)
    with tempfile.TemporaryDirectory(prefix="rlrun-bench-trainer-") as scratch:
        steps = asyncio.run(measure_steps(5 if quick else 30, Path(scratch)))
    broadcast = asyncio.run(measure_broadcast(3 if quick else 15, quick))
    lora = asyncio.run(measure_lora(3 if quick else 15, quick))
    result = {"benchmark": "trainer", "quick": quick, **steps, **broadcast, **lora}
    print(f"batch: {PROMPTS * GROUP} samples, {steps['tokens_per_step']} tokens, tiny-d64")
    print(f"(a) bare torch loop:          {steps['bare_step_ms']:8.2f} ms/step")
    print(
        f"(b) trainer step:             {steps['trainer_step_ms']:8.2f} ms/step "
        f"({steps['trainer_tokens_per_s']:.0f} tokens/s)"
    )
    print(f"(c) SubmitBatch over gRPC:    {steps['service_step_ms']:8.2f} ms/step")
    print(
        f"a/b = {steps['ratio_vs_bare_loop']:.3f} (target >= 0.9)   a/c = {steps['service_ratio_vs_bare_loop']:.3f}"
    )
    print(
        f"broadcast of {broadcast['broadcast_bytes'] / 2**20:.1f} MiB: trainer {broadcast['broadcast_ms']:.1f} ms "
        f"({broadcast['broadcast_mib_per_s']:.0f} MiB/s), raw stream {broadcast['raw_stream_ms']:.1f} ms "
        f"({broadcast['raw_stream_mib_per_s']:.0f} MiB/s), prebuilt messages {broadcast['prebuilt_stream_ms']:.1f} ms"
    )
    print(
        f"raw/trainer = {broadcast['broadcast_ratio_vs_raw']:.3f} (target >= 0.8)   "
        f"prebuilt/trainer = {broadcast['broadcast_ratio_vs_prebuilt']:.3f}"
    )
    print(
        f"LoRA r={lora['lora_rank']} vs full, same model: sync {lora['lora_sync_bytes'] / 2**20:.2f} MiB "
        f"in {lora['lora_sync_ms']:.1f} ms vs {lora['full_sync_bytes'] / 2**20:.2f} MiB in "
        f"{lora['full_sync_ms']:.1f} ms (bytes {lora['lora_sync_bytes_ratio']:.1f}x, time "
        f"{lora['lora_sync_time_ratio']:.1f}x fewer); AdamW state {lora['lora_optimizer_bytes'] / 2**20:.2f} "
        f"MiB vs {lora['full_optimizer_bytes'] / 2**20:.2f} MiB ({lora['lora_optimizer_bytes_ratio']:.1f}x)"
    )
    return emit_result(result, args)
