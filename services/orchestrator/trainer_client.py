"""Client of the trainer (TrainerService)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc, training_pb2


@dataclass(frozen=True)
class TrainerStatus:
    step: int
    version: int
    resume_state: bytes
    last_checkpoint: str


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
    def __init__(self, address: str, options: ClientOptions):
        self.address = address
        self.channel = open_channel(address, options)
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self.channel)

    async def status(self) -> TrainerStatus:
        reply = await self.stub.GetStatus(trainer_pb2.GetTrainerStatusRequest())
        return TrainerStatus(
            reply.step, reply.policy_version, bytes(reply.resume_state), reply.last_checkpoint
        )

    async def submit(self, batch: training_pb2.TrainingBatch) -> StepResult:
        """Returns after the step and the weight broadcast."""
        reply = await self.stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch))
        return StepResult(
            step=reply.step,
            version=reply.policy_version,
            skipped=reply.skipped,
            skip_reason=reply.skip_reason,
            metrics=dict(reply.metrics),
            broadcast_failures=[f"{b.address}: {b.error}" for b in reply.broadcasts if not b.ok],
        )

    async def save_checkpoint(self, extra_state: bytes) -> str:
        reply = await self.stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(extra_state=extra_state))
        return reply.path

    async def close(self) -> None:
        await self.channel.close()
