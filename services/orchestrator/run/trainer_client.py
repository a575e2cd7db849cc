"""Client of the trainer (TrainerService).

Every call but SubmitBatch waits out a trainer that is restarting (UNAVAILABLE, for
`grpc.unavailable_retry_s`). SubmitBatch is not retried here: when it fails the batch may or
may not have trained, so the run resumes from the trainer's checkpoint instead (TrainerLost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc

from rlrun.common.grpc_client import ClientOptions, call_while_unavailable, open_channel
from rlrun.common.types import TrainingSample
from rlrun.common.wire import sample_to_proto
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc, training_pb2

LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})
"""SubmitBatch failures that mean the trainer is not where the run left it: it is gone (a
restart in progress) or it is at another step (it restarted from a checkpoint)."""


EncodedBatch: TypeAlias = training_pb2.TrainingBatch
"""A batch's samples in wire form (encode_batch); the step, version and metrics are set when
it is submitted, since they are known only then."""


def encode_batch(samples: Sequence[TrainingSample]) -> EncodedBatch:
    """The samples as the trainer takes them (done while the batch is built, not at submit)."""
    return training_pb2.TrainingBatch(samples=[sample_to_proto(s) for s in samples])


class TrainerLost(RuntimeError):
    """The trainer died or restarted while a batch was being trained."""


@dataclass(frozen=True)
class Resumed:
    """Where the trainer stands after a rollback."""

    step: int
    version: int
    checkpoint: str
    """The folder it loaded; empty when it already was at that step."""
    resume_state: bytes


@dataclass
class StepResult:
    step: int
    version: int
    skipped: bool
    skip_reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    broadcast_failures: list[str] = field(default_factory=list)
    """`address: error` of every inference replica the new weights did not reach."""


class TrainerClient:
    def __init__(self, address: str, options: ClientOptions, unavailable_retry_s: float):
        self.address = address
        self.channel = open_channel(address, options)
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self.channel)
        self.unavailable_retry_s = unavailable_retry_s

    async def submit(
        self,
        batch: EncodedBatch,
        *,
        step: int,
        version: int,
        learning_rate: float | None,
        metrics: dict[str, float],
        orchestrator_state: bytes,
    ) -> StepResult:
        """Trains `batch` as step `step` at policy `version` (None: the configured learning
        rate); returns after the step and the weight broadcast; raises TrainerLost."""
        batch.step, batch.policy_version = step, version
        if learning_rate is not None:
            batch.learning_rate = learning_rate
        batch.metrics.clear()
        batch.metrics.update(metrics)
        request = trainer_pb2.SubmitBatchRequest(batch=batch, orchestrator_state=orchestrator_state)
        try:
            reply = await self.stub.SubmitBatch(request)
        except grpc.aio.AioRpcError as error:
            if error.code() in LOST_CODES:
                raise TrainerLost(
                    f"SubmitBatch of step {batch.step}: {error.code().name}: {error.details()}"
                ) from None
            raise
        return StepResult(
            step=reply.step,
            version=reply.policy_version,
            skipped=reply.skipped,
            skip_reason=reply.skip_reason,
            metrics=dict(reply.metrics),
            broadcast_failures=[f"{b.address}: {b.error}" for b in reply.broadcasts if not b.ok],
        )

    async def rollback(self, max_step: int | None) -> Resumed:
        """Back to the trainer's newest checkpoint at or before `max_step` (None: newest)."""
        request = trainer_pb2.RollbackRequest(max_step=-1 if max_step is None else max_step)
        reply = await call_while_unavailable(
            lambda: self.stub.Rollback(request), self.unavailable_retry_s, f"trainer {self.address} Rollback"
        )
        return Resumed(reply.step, reply.policy_version, reply.checkpoint, bytes(reply.resume_state))

    async def save_checkpoint(self, extra_state: bytes, step: int) -> str:
        """Saves `extra_state` with the trainer's weights of `step`; raises TrainerLost when the
        trainer is at another step."""
        request = trainer_pb2.SaveCheckpointRequest(extra_state=extra_state, step=step)
        try:
            reply = await call_while_unavailable(
                lambda: self.stub.SaveCheckpoint(request),
                self.unavailable_retry_s,
                f"trainer {self.address} SaveCheckpoint",
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in LOST_CODES:
                raise TrainerLost(
                    f"SaveCheckpoint at step {step}: {error.code().name}: {error.details()}"
                ) from None
            raise
        return reply.path

    async def close(self) -> None:
        await self.channel.close()
