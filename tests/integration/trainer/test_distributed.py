"""torchrun with two CPU ranks (gloo) makes the same update as one process on the same
batches: rank 0 serves gRPC and hands every batch to rank 1; the broadcast weights compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.checkpoint import checkpoint_root, save_checkpoint
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.packing import pack_first_fit_decreasing
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]
SERVE = ["-m", "rlrun.cli", "serve", "trainer"]
TRAINER = {"micro_batch_tokens": 64, "grad_steps_per_batch": 2, "weight_decay": 0.1}


def submit(stub, batch):
    return stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch_to_proto(batch)))


def assert_weights_match(
    received: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], atol: float = 1e-6
) -> None:
    assert received.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(received[name], tensor, rtol=1e-4, atol=atol, msg=name)


LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


# FSDP2 is what `parallel = "auto"` runs; DDP, the alternative, is in the slow suite. With
# context_parallel = 2 both ranks train every micro-batch, each half of its tokens (ring
# attention; its gradients against one process: test_context_parallel.py). Under LoRA only the
# adapters train (FSDP shards frozen and trained parameters together) and travel.
@pytest.mark.parametrize(
    "settings",
    [
        {"parallel": "fsdp"},
        pytest.param({"parallel": "ddp"}, marks=pytest.mark.slow),
        {"parallel": "fsdp", "context_parallel": 2},
        {"parallel": "fsdp", "lora": LORA},
    ],
    ids=["fsdp", "ddp", "fsdp-context-parallel", "fsdp-lora"],
)
async def test_two_cpu_ranks_make_the_same_update_as_one_process(
    settings, tmp_path, start_replica, spawn_service, write_run_file
):
    batches = [synthetic_batch(step, num_samples=17) for step in range(2)]
    lengths = [len(s.token_ids) for s in batches[0].samples]
    assert len(pack_first_fit_decreasing(lengths, TRAINER["micro_batch_tokens"])) % 2 == 1, "rank 1 must pad"
    lora = settings.get("lora")
    replica = await start_replica(lora=lora)
    trainer_settings = {**TRAINER, **{key: value for key, value in settings.items() if key != "lora"}}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [replica.address], trainer_settings)
    overrides = [f"--set=trainer.lora.{key}={json.dumps(value)}" for key, value in (lora or {}).items()]
    trainer = await spawn_service([*TORCHRUN, *SERVE, "--config", str(run_file), *overrides])
    stub = trainer_pb2_grpc.TrainerServiceStub(trainer.channel)

    one_process = TRAINER if lora is None else {**TRAINER, "lora": lora}
    single = build_learner(synthetic_config(tmp_path, trainer=one_process), Parallelism.single())
    for batch in batches:
        reply = await submit(stub, batch)
        expected = single.train(batch)
        assert not reply.skipped and [b.ok for b in reply.broadcasts] == [True]
        assert reply.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-5, abs=1e-7)
        assert reply.metrics["grad_norm"] == pytest.approx(expected.metrics["grad_norm"], rel=1e-4)
    status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.world_size, status.step, replica.servicer.version) == (2, 2, 2)
    # Ring attention's float32 softmax rounds otherwise than SDPA's (gradients within 1e-6:
    # test_context_parallel.py), and AdamW's first steps move a weight by about lr = 1e-3
    # whatever its gradient's size, so a near-zero gradient's rounding can move a weight by a
    # few 1e-6: 1e-5 is 1% of one step.
    atol = 1e-5 if settings.get("context_parallel", 1) > 1 else 1e-6
    assert_weights_match(replica.servicer.weights, single.full_weights(), atol=atol)

    saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(extra_state=b"x"))
    assert Path(saved.path, "meta.json").exists() and saved.step == 2
    assert Path(saved.path, "adapter" if lora else "model").is_dir()


async def test_two_fsdp_ranks_resume_a_single_process_checkpoint_exactly(
    tmp_path, start_replica, spawn_service, write_run_file
):
    single = build_learner(synthetic_config(tmp_path, trainer=TRAINER), Parallelism.single())
    for step in range(2):
        single.train(synthetic_batch(step, num_samples=17))
    root = checkpoint_root(tmp_path / "out")
    save_checkpoint(root, single.capture_state(), b"state", {"model_type": "llama"}, world_size=1, keep=1)
    replica = await start_replica()
    trainer_settings = {**TRAINER, "parallel": "fsdp"}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [replica.address], trainer_settings)
    trainer = await spawn_service([*TORCHRUN, *SERVE, "--config", str(run_file)])
    stub = trainer_pb2_grpc.TrainerServiceStub(trainer.channel)

    status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.world_size, status.resume_state) == (2, 2, b"state")
    batch = synthetic_batch(2, num_samples=17)
    reply = await submit(stub, batch)
    expected = single.train(batch)
    assert reply.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-5, abs=1e-7)
    assert_weights_match(replica.servicer.weights, single.full_weights())
