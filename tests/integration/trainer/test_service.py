"""TrainerService on 127.0.0.1, driven by a real gRPC client, broadcasting to two test
replicas: one live, one down."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import torch

from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.checkpoint import load_checkpoint
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import trainer_pb2


def submit(stub, batch):
    return stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch_to_proto(batch)))


def snapshot(learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def unchanged(learner, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(), strict=True))


async def test_a_batch_trains_and_reaches_the_live_replica_while_the_dead_one_is_reported(
    start_trainer, start_replica, dead_address
):
    dead = dead_address
    live = await start_replica()
    trainer = await start_trainer([live.address, dead])

    reply = await submit(trainer.stub, synthetic_batch(0))

    assert (reply.step, reply.policy_version, reply.skipped) == (1, 1, False)
    for key in (
        "loss_rl",
        "loss_ce",
        "grad_norm",
        "mismatch_kl",
        "masked_frac_low",
        "masked_frac_high",
        "entropy",
        "tokens",
        "step_seconds",
        "broadcast_seconds",
        "lr",
    ):
        assert key in reply.metrics, key
    by_address = {b.address: b for b in reply.broadcasts}
    assert by_address[live.address].ok and by_address[live.address].bytes > 0
    assert not by_address[dead].ok and "UNAVAILABLE" in by_address[dead].error
    assert live.servicer.version == 1
    sent = trainer.learner.full_weights()
    assert live.servicer.weights.keys() == sent.keys()
    assert all(torch.equal(live.servicer.weights[k], sent[k]) for k in sent)

    reply = await submit(trainer.stub, synthetic_batch(1))
    assert reply.policy_version == 2 and live.servicer.version == 2 and live.servicer.updates == 2


async def test_a_batch_for_the_wrong_step_is_refused_and_trains_nothing(start_trainer, start_replica):
    live = await start_replica()
    trainer = await start_trainer([live.address])
    before = snapshot(trainer.learner)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await submit(trainer.stub, synthetic_batch(5))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "batch.step" in error.value.details() and "expects step 0, got 5" in error.value.details()
    assert unchanged(trainer.learner, before) and trainer.learner.step == 0
    assert live.servicer.updates == 0


def too_long(batch) -> None:
    sample = batch.samples[0]
    for values, pad in (
        (sample.token_ids, 5),
        (sample.mask, True),
        (sample.logprobs, 0.0),
        (sample.temperatures, 1.0),
    ):
        values.extend([pad] * 100)
    sample.channels.clear()


def nothing_trains(batch) -> None:
    for sample in batch.samples:
        sample.channels.clear()


def nan_advantage(batch) -> None:
    batch.samples[3].channels[0].values[5] = float("nan")


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (lambda b: b.samples[2].mask.pop(), "batch.samples[2].mask"),
        (lambda b: b.samples[1].token_ids.__setitem__(3, 1000), "batch.samples[1].token_ids[3]"),
        (lambda b: b.samples[0].temperatures.__setitem__(4, 0.0), "batch.samples[0].temperatures[4]"),
        (lambda b: b.samples[3].channels[0].values.pop(), "batch.samples[3].channels[0].values"),
        (nan_advantage, "batch.samples[3].channels[0].values[5]"),
        (too_long, "batch.samples[0].token_ids"),
        (nothing_trains, "batch.samples"),
        (lambda b: b.samples.clear(), "batch.samples"),
    ],
)
async def test_a_malformed_batch_is_invalid_argument_naming_the_field_and_trains_nothing(
    start_trainer, corrupt, field
):
    trainer = await start_trainer([], micro_batch_tokens=64)
    before = snapshot(trainer.learner)
    batch = synthetic_batch(0)
    corrupt(batch)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await submit(trainer.stub, batch)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(field)
    assert unchanged(trainer.learner, before) and trainer.learner.step == 0
    status = await trainer.stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.policy_version) == (0, 0)


async def test_a_non_finite_loss_is_reported_as_skipped_and_nothing_is_broadcast(
    start_trainer, start_replica
):
    live = await start_replica()
    trainer = await start_trainer([live.address])
    batch = synthetic_batch(0)
    for sample in batch.samples:
        sample.logprobs = [-1e38 if m else 0.0 for m in sample.mask]
    before = snapshot(trainer.learner)
    reply = await submit(trainer.stub, batch)
    assert reply.skipped and "non-finite" in reply.skip_reason
    assert (reply.step, reply.policy_version) == (0, 0) and not reply.broadcasts
    assert unchanged(trainer.learner, before) and live.servicer.updates == 0
    assert not (await submit(trainer.stub, synthetic_batch(0))).skipped


async def test_status_and_checkpoint_on_request(start_trainer):
    trainer = await start_trainer([])
    await submit(trainer.stub, synthetic_batch(0))
    saved = await trainer.stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(extra_state=b"orchestrator"))
    assert saved.step == 1
    status = await trainer.stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert (status.step, status.policy_version, status.world_size) == (1, 1, 1)
    assert status.last_checkpoint == saved.path
    assert status.last_metrics["loss"] == pytest.approx(status.last_metrics["loss_rl"])
    state, extra = load_checkpoint(Path(saved.path))
    assert (state.step, state.version, extra) == (1, 1, b"orchestrator")


async def test_checkpoints_on_the_configured_interval(start_trainer):
    trainer = await start_trainer([], checkpoint={"interval": 2, "keep": 1})
    for step in range(3):
        await submit(trainer.stub, synthetic_batch(step))
    status = await trainer.stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
    assert status.last_checkpoint.endswith("step_2")
    assert load_checkpoint(Path(status.last_checkpoint))[1] == b""
