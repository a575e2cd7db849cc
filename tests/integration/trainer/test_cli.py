"""`rlrun serve trainer` as a process: a fresh start saves step 0; training with broadcast
keeps the orchestrator's state of each step; SIGTERM saves the unsaved steps; a restart
without any flag resumes from the newest checkpoint (state, weights pushed to the replicas);
Rollback goes back to an older one and deletes the later ones; `--fresh` starts over."""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest
import torch

from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc


def submit(stub, step: int):
    request = trainer_pb2.SubmitBatchRequest(
        batch=batch_to_proto(synthetic_batch(step)), orchestrator_state=f"orchestrator@{step + 1}".encode()
    )
    return stub.SubmitBatch(request)


async def replica_at(replica, version: int) -> None:
    async with asyncio.timeout(60):
        while replica.servicer.version != version:
            await asyncio.sleep(0.05)


async def test_serve_resumes_by_default_rolls_back_and_starts_fresh(
    tmp_path, start_replica, spawn_service, write_run_file
):
    replica = await start_replica()
    checkpoints = tmp_path / "out" / "checkpoints"
    trainer_settings = {"micro_batch_tokens": 256, "checkpoint.interval": 0, "checkpoint.interval_s": 0}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [replica.address], trainer_settings)
    serve = [sys.executable, "-m", "rlrun.cli", "serve", "trainer", "--config", str(run_file)]

    first = await spawn_service(serve)  # nothing saved yet: a fresh start, which saves step 0
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_0"]
    stub = trainer_pb2_grpc.TrainerServiceStub(first.channel)
    for step in range(2):
        reply = await submit(stub, step)
        assert reply.policy_version == step + 1 and reply.broadcasts[0].ok
    saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest())  # keeps orchestrator@2
    weights_at_2 = dict(replica.servicer.weights)
    third = await submit(stub, 2)
    assert await first.stop() == 0  # SIGTERM: step 3 was not saved yet, so it is now
    assert (tmp_path / "out" / "logs" / "trainer.log").exists()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2", "step_3"]  # keep = 2

    resumed = await spawn_service(serve)
    stub = trainer_pb2_grpc.TrainerServiceStub(resumed.channel)
    status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.policy_version, status.resume_state) == (3, 3, b"orchestrator@3")

    back = await stub.Rollback(trainer_pb2.RollbackRequest(max_step=2))
    assert (back.step, back.policy_version, back.resume_state) == (2, 2, b"orchestrator@2")
    assert back.checkpoint == saved.path
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2"]  # step 3 is trained again
    assert replica.servicer.version == 2 and replica.servicer.rollbacks >= 1
    assert all(torch.equal(replica.servicer.weights[k], weights_at_2[k]) for k in weights_at_2)
    again = await submit(stub, 2)
    assert again.metrics["loss"] == third.metrics["loss"]
    assert again.policy_version == 3
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # state of another step: nothing saved
        await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(extra_state=b"x", step=5))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith("step: the trainer expects step 3, got 5")
    assert await resumed.stop() == 0

    fresh = await spawn_service([*serve, "--fresh"])
    stub = trainer_pb2_grpc.TrainerServiceStub(fresh.channel)
    status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.policy_version, status.resume_state) == (0, 0, b"")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_0"]


async def test_a_replica_added_to_the_config_file_is_synced_and_a_removed_one_dropped(
    tmp_path, start_replica, spawn_service, write_run_file
):
    """The operator scales inference by rewriting inference.addresses in the mounted config
    file; the running trainer follows it (trainer.broadcast.resync_interval_s)."""
    first, second = await start_replica(), await start_replica()
    settings = {"micro_batch_tokens": 256, "broadcast.resync_interval_s": 0.2}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [first.address], settings)
    trainer = await spawn_service(
        [sys.executable, "-m", "rlrun.cli", "serve", "trainer", "--config", str(run_file)]
    )
    stub = trainer_pb2_grpc.TrainerServiceStub(trainer.channel)
    await submit(stub, 0)
    assert (first.servicer.version, second.servicer.version) == (1, 0)

    write_run_file(run_file, tmp_path / "out", [first.address, second.address], settings)
    await replica_at(second, 1)  # synced without waiting for a step
    assert all(
        torch.equal(second.servicer.weights[k], first.servicer.weights[k]) for k in first.servicer.weights
    )

    write_run_file(run_file, tmp_path / "out", [second.address], settings)
    await asyncio.sleep(1.0)
    reply = await submit(stub, 1)
    assert [b.address for b in reply.broadcasts] == [second.address]
    assert (first.servicer.version, second.servicer.version) == (1, 2)
    assert await trainer.stop() == 0
