"""GPU-only paths: the learner on CUDA, the NCCL weight broadcast, FSDP2 over NCCL. They skip
cleanly without the GPUs they need (two ranks of one NCCL group cannot share a GPU)."""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.model import build_model
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc

pytestmark = pytest.mark.gpu

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs (NCCL ranks cannot share a GPU)")
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the NCCL weight group uses vLLM's PyNcclCommunicator"
)
TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]


@needs_gpu
def test_the_learner_on_cuda_makes_the_cpu_update(tmp_path):
    config = synthetic_config(tmp_path, trainer={"grad_steps_per_batch": 2})
    on_cpu = build_learner(config, Parallelism.single("cpu"))
    on_gpu = build_learner(config, Parallelism.single("cuda"))
    assert on_gpu.optimizer.defaults["fused"] and not on_cpu.optimizer.defaults["fused"]
    for step in range(2):
        expected, got = on_cpu.train(synthetic_batch(step)), on_gpu.train(synthetic_batch(step))
        assert got.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-3, abs=1e-5)
    reference = on_cpu.full_weights()
    for name, tensor in on_gpu.full_weights().items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-3, atol=1e-4, msg=name)


@needs_gpu
def test_optimizer_offload_frees_the_device_memory_of_adamws_state(tmp_path):
    """`trainer.optimizer.offload = "cpu"` on CUDA: AdamW's two moments per parameter leave
    the device (what the device still holds after two steps shrinks by twice the
    parameters' bytes), and the steps match the on-device fused AdamW's."""

    def after_two_steps(offload: str) -> tuple[int, int, set[str], list[float]]:
        config = synthetic_config(tmp_path, model="tiny-d128", trainer={"optimizer": {"offload": offload}})
        learner = build_learner(config, Parallelism.single("cuda"))
        losses = [learner.train(synthetic_batch(step)).metrics["loss"] for step in range(2)]
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        params = sum(p.numel() * p.element_size() for p in learner.model.parameters())
        moments = {
            state[key].device.type
            for state in learner.optimizer.state.values()
            for key in ("exp_avg", "exp_avg_sq")
        }
        del learner
        gc.collect()
        torch.cuda.empty_cache()
        return held, params, moments, losses

    on_device, params, where, expected = after_two_steps("none")
    offloaded, _, where_offloaded, losses = after_two_steps("cpu")
    assert (where, where_offloaded) == ({"cuda"}, {"cpu"})
    assert on_device - offloaded >= 1.9 * params, (on_device, offloaded, params)
    assert losses == pytest.approx(expected, rel=1e-3, abs=1e-5)


@needs_two_gpus
@needs_vllm
async def test_nccl_broadcast_reaches_a_replica_on_another_gpu(start_replica, dead_address, tmp_path):
    replica = await start_replica(backend="pynccl", device="cuda:1")
    settings = BroadcastConfig(retries=1, timeout_s=60)
    broadcaster = CollectiveWeightBroadcaster(
        [replica.address, dead_address],
        settings,
        ClientOptions(),
        host="127.0.0.1",
        backend="pynccl",
        device="cuda:0",
    )
    weights = {
        k: v.to("cuda:0") + 1
        for k, v in broadcast_tensors(build_model(synthetic_config(tmp_path).model)).items()
    }
    try:
        for version in (1, 2):
            results = await broadcaster.broadcast({k: v * version for k, v in weights.items()}, version)
            assert [r.ok for r in results] == [True, False]
            assert replica.servicer.version == version
            for name, tensor in weights.items():
                assert torch.equal(replica.servicer.weights[name], (tensor * version).cpu()), name
    finally:
        await broadcaster.close()


@needs_two_gpus
async def test_fsdp2_over_nccl_makes_the_single_process_update(
    tmp_path, start_replica, spawn_service, write_run_file
):
    replica = await start_replica()
    trainer_settings = {"device": "cuda", "micro_batch_tokens": 64, "parallel": "fsdp"}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [replica.address], trainer_settings)
    trainer = await spawn_service(
        [*TORCHRUN, "-m", "rlrun.cli", "serve", "trainer", "--config", str(run_file)]
    )
    stub = trainer_pb2_grpc.TrainerServiceStub(trainer.channel)
    single = build_learner(
        synthetic_config(tmp_path, trainer={"micro_batch_tokens": 64}), Parallelism.single("cpu")
    )
    for step in range(2):
        batch = synthetic_batch(step, num_samples=17)
        reply = await stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch_to_proto(batch)))
        expected = single.train(batch)
        assert not reply.skipped
        assert reply.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-3, abs=1e-5)
    for name, tensor in single.full_weights().items():
        torch.testing.assert_close(replica.servicer.weights[name], tensor, rtol=1e-3, atol=1e-4, msg=name)
