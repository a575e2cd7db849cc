"""`rlrun serve trainer` as a process: ready line, training with broadcast, a checkpoint on
request, graceful SIGTERM, then `--resume latest` restoring step, version, weights and the
orchestrator's extra_state, and pushing the resumed weights to the replicas."""

from __future__ import annotations

import asyncio
import sys

import torch

from rlrun.common.wire import batch_to_proto
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc


def submit(stub, step: int):
    return stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch_to_proto(synthetic_batch(step))))


async def test_serve_checkpoint_and_resume_latest(tmp_path, start_replica, spawn_service, write_run_file):
    replica = await start_replica()
    trainer_settings = {"micro_batch_tokens": 256}
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [replica.address], trainer_settings)
    serve = [
        sys.executable,
        "-m",
        "rlrun.cli",
        "serve",
        "trainer",
        "--config",
        str(run_file),
        "--resume",
        "latest",
    ]

    first = await spawn_service(serve)  # nothing saved yet: a fresh start
    stub = trainer_pb2_grpc.TrainerServiceStub(first.channel)
    for step in range(2):
        reply = await submit(stub, step)
        assert reply.policy_version == step + 1 and reply.broadcasts[0].ok
    saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(extra_state=b"orchestrator@2"))
    weights_at_2 = dict(replica.servicer.weights)
    third = await submit(stub, 2)
    assert await first.stop() == 0
    assert (tmp_path / "out" / "logs" / "trainer.log").exists()

    resumed = await spawn_service(serve)
    stub = trainer_pb2_grpc.TrainerServiceStub(resumed.channel)
    status = await stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.policy_version) == (2, 2)
    assert status.resume_state == b"orchestrator@2" and status.last_checkpoint == saved.path
    async with asyncio.timeout(60):
        while replica.servicer.version != 2:  # the resumed weights are pushed in the background
            await asyncio.sleep(0.05)
    assert all(torch.equal(replica.servicer.weights[k], weights_at_2[k]) for k in weights_at_2)
    again = await submit(stub, 2)
    assert again.metrics["loss"] == third.metrics["loss"]
    assert again.policy_version == 3
