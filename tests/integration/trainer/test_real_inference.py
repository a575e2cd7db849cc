"""The trainer broadcasting to two real inference servers (`rlrun serve inference`, torch
engine): both serve the new version, and score tokens exactly as the trainer's model does."""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch

from rlrun.common.model import PackedCausal
from rlrun.common.wire.training import TrainingSample, batch_to_proto
from rlrun.trainer.loss import token_logprobs
from rlrun.trainer.packing import pack_micro_batch
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import inference_pb2, inference_pb2_grpc, trainer_pb2

TOKENS = [5, 17, 33, 9, 41, 12, 7, 28, 19, 3]


def trainer_logprobs(learner, tokens: list[int]) -> list[float]:
    n = len(tokens)
    packed = pack_micro_batch([TrainingSample(tokens, [True] * n, [0.0] * n, [1.0] * n)])
    with torch.no_grad():
        logits = learner.model(
            packed.input_ids, packed.positions, PackedCausal.from_offsets(packed.cu_seqlens)
        )
        logprobs, _ = token_logprobs(logits[packed.predict_rows], packed.targets, packed.temperatures)
    return logprobs.tolist()


async def score(stub) -> inference_pb2.ScoreResponse:
    return await stub.Score(inference_pb2.ScoreRequest(token_ids=TOKENS, start=1, temperature=1.0))


async def test_broadcast_to_two_real_inference_servers(
    tmp_path, spawn_service, start_trainer, write_run_file
):
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [], {})
    serve = [sys.executable, "-m", "rlrun.cli", "serve", "inference", "--config", str(run_file)]
    servers = await asyncio.gather(spawn_service(serve), spawn_service(serve))
    stubs = [inference_pb2_grpc.InferenceServiceStub(s.channel) for s in servers]
    trainer = await start_trainer([s.address for s in servers])

    before = await score(stubs[0])
    assert before.policy_version == 0
    assert before.logprobs == pytest.approx(trainer_logprobs(trainer.learner, TOKENS), abs=1e-5)

    for step in range(2):
        batch = batch_to_proto(synthetic_batch(step))
        reply = await trainer.stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch))
        assert [b.ok for b in reply.broadcasts] == [True, True], [b.error for b in reply.broadcasts]

    expected = trainer_logprobs(trainer.learner, TOKENS)
    for stub in stubs:
        status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
        assert status.policy_version == 2
        after = await score(stub)
        assert after.policy_version == 2
        assert after.logprobs == pytest.approx(expected, abs=1e-5)
    assert after.logprobs != pytest.approx(list(before.logprobs), abs=1e-5)
