"""The trainer's step -> a real `rlrun serve inference` (torch engine, its own engine process)
over the transports that bypass the gRPC stream, on CPU: "ipc" (the trainer's shared-memory
staging buffer) and "nccl" (a torch.distributed group, gloo from a CPU trainer). The replica
then scores tokens exactly as the trainer's model does."""

from __future__ import annotations

import sys

import pytest

from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.ipc import IpcWeightBroadcaster
from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import inference_pb2, inference_pb2_grpc, trainer_pb2

from .test_real_inference import TOKENS, score, trainer_logprobs

BUILT = {"ipc": IpcWeightBroadcaster, "nccl": CollectiveWeightBroadcaster}


@pytest.mark.parametrize("transport", ["ipc", "nccl"])
async def test_a_trainer_step_reaches_a_real_replica(
    tmp_path, spawn_service, start_trainer, write_run_file, transport
):
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [], {})
    server = await spawn_service(
        [sys.executable, "-m", "rlrun.cli", "serve", "inference", "--config", str(run_file)]
    )
    stub = inference_pb2_grpc.InferenceServiceStub(server.channel)
    trainer = await start_trainer([server.address], broadcast={"transport": transport, "retries": 1})
    assert type(trainer.runtime.broadcaster) is BUILT[transport]
    before = await score(stub)

    for step in range(2):
        batch = batch_to_proto(synthetic_batch(step))
        reply = await trainer.stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch))
        assert [b.ok for b in reply.broadcasts] == [True], [b.error for b in reply.broadcasts]
        assert reply.broadcasts[0].bytes > 0

    status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
    assert status.policy_version == 2
    after = await score(stub)
    assert after.logprobs == pytest.approx(trainer_logprobs(trainer.learner, TOKENS), abs=1e-5)
    assert after.logprobs != pytest.approx(list(before.logprobs), abs=1e-5)
