"""rlrun/v1/trainer.proto: the TrainerService's messages in process, shared by the trainer's
servicer and its clients (the orchestrator, an inference replica asking the live version)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.training import EncodedSamples, batch_from_proto
from rlrun.v1 import trainer_pb2

SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name


@dataclass
class BroadcastResult:
    """How one inference replica took a weight update."""

    address: str
    ok: bool
    error: str = ""
    seconds: float = 0.0
    bytes: int = 0
    transport: str = ""
    """The transport that carried it (grpc, ipc, nccl, pynccl); the trainer's own bookkeeping,
    not on the wire."""


@dataclass
class StepResult:
    """A trained (or skipped) step: the trainer's step and policy version after it."""

    step: int
    version: int
    skipped: bool
    skip_reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    """Loss per channel, grad norm, mismatch KL, ..."""
    broadcasts: list[BroadcastResult] = field(default_factory=list)
    """One per replica the new weights were sent to."""

    @property
    def broadcast_failures(self) -> list[str]:
        """`address: error` of every replica the new weights did not reach."""
        return [f"{b.address}: {b.error}" for b in self.broadcasts if not b.ok]


@dataclass
class SubmitBatch:
    """SubmitBatch: a batch (its samples encoded while it was built) and the orchestrator's
    state as it will be once the batch trained."""

    samples: EncodedSamples
    step: int
    policy_version: int
    learning_rate: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    orchestrator_state: bytes = b""


def submit_request_to_proto(request: SubmitBatch) -> trainer_pb2.SubmitBatchRequest:
    batch = request.samples.message
    batch.step, batch.policy_version = request.step, request.policy_version
    batch.ClearField("learning_rate")
    if request.learning_rate is not None:
        batch.learning_rate = request.learning_rate
    batch.metrics.clear()
    batch.metrics.update(request.metrics)
    return trainer_pb2.SubmitBatchRequest(batch=batch, orchestrator_state=request.orchestrator_state)


def submit_request_from_proto(
    msg: trainer_pb2.SubmitBatchRequest, *, limits: RequestLimits, vocab_size: int | None = None
):
    """(the validated batch, the orchestrator state); at most `limits.max_batch_samples`
    samples, checked before any is read."""
    limits.check("batch.samples", len(msg.batch.samples), "max_batch_samples", "samples")
    return batch_from_proto(msg.batch, "batch", vocab_size=vocab_size), msg.orchestrator_state


def step_result_to_proto(result: StepResult) -> trainer_pb2.SubmitBatchResponse:
    return trainer_pb2.SubmitBatchResponse(
        step=result.step,
        policy_version=result.version,
        skipped=result.skipped,
        skip_reason=result.skip_reason,
        metrics=result.metrics,
        broadcasts=[
            trainer_pb2.BroadcastResult(
                address=b.address, ok=b.ok, error=b.error, seconds=b.seconds, bytes=b.bytes
            )
            for b in result.broadcasts
        ],
    )


def step_result_from_proto(msg: trainer_pb2.SubmitBatchResponse) -> StepResult:
    return StepResult(
        step=msg.step,
        version=msg.policy_version,
        skipped=msg.skipped,
        skip_reason=msg.skip_reason,
        metrics=dict(msg.metrics),
        broadcasts=[BroadcastResult(b.address, b.ok, b.error, b.seconds, b.bytes) for b in msg.broadcasts],
    )


@dataclass
class TrainerStatus:
    step: int
    """Optimizer steps taken (the next batch must have step == step)."""
    policy_version: int
    world_size: int = 1
    last_checkpoint: str = ""
    last_metrics: dict[str, float] = field(default_factory=dict)
    resume_state: bytes = b""
    """The orchestrator's state as of `step`."""


def status_request() -> trainer_pb2.GetTrainerStatusRequest:
    return trainer_pb2.GetTrainerStatusRequest()


def status_to_proto(status: TrainerStatus) -> trainer_pb2.GetTrainerStatusResponse:
    return trainer_pb2.GetTrainerStatusResponse(
        step=status.step,
        policy_version=status.policy_version,
        world_size=status.world_size,
        last_checkpoint=status.last_checkpoint,
        last_metrics=status.last_metrics,
        resume_state=status.resume_state,
    )


def status_from_proto(msg: trainer_pb2.GetTrainerStatusResponse) -> TrainerStatus:
    return TrainerStatus(
        msg.step,
        msg.policy_version,
        msg.world_size,
        msg.last_checkpoint,
        dict(msg.last_metrics),
        bytes(msg.resume_state),
    )


@dataclass
class SaveCheckpoint:
    extra_state: bytes = b""
    """Stored with the checkpoint (the orchestrator's state); empty keeps the latest one."""
    step: int | None = None
    """The step `extra_state` belongs to: a trainer at another step saves nothing."""


def save_request_to_proto(request: SaveCheckpoint) -> trainer_pb2.SaveCheckpointRequest:
    msg = trainer_pb2.SaveCheckpointRequest(extra_state=request.extra_state)
    if request.step is not None:
        msg.step = request.step
    return msg


def save_request_from_proto(msg: trainer_pb2.SaveCheckpointRequest) -> SaveCheckpoint:
    return SaveCheckpoint(msg.extra_state, msg.step if msg.HasField("step") else None)


def saved_to_proto(path: str, step: int) -> trainer_pb2.SaveCheckpointResponse:
    return trainer_pb2.SaveCheckpointResponse(path=path, step=step)


def saved_from_proto(msg: trainer_pb2.SaveCheckpointResponse) -> str:
    """The checkpoint's folder."""
    return msg.path


@dataclass(frozen=True)
class Resumed:
    """Where the trainer stands after a rollback."""

    step: int
    version: int
    checkpoint: str
    """The folder it loaded; empty when it already was at that step."""
    resume_state: bytes


def rollback_request_to_proto(max_step: int | None) -> trainer_pb2.RollbackRequest:
    """`max_step`: the newest step the caller can resume from (None: the newest checkpoint)."""
    return trainer_pb2.RollbackRequest(max_step=-1 if max_step is None else max_step)


def rollback_request_from_proto(msg: trainer_pb2.RollbackRequest) -> int | None:
    return msg.max_step if msg.max_step >= 0 else None


def resumed_to_proto(resumed: Resumed) -> trainer_pb2.RollbackResponse:
    return trainer_pb2.RollbackResponse(
        step=resumed.step,
        policy_version=resumed.version,
        checkpoint=resumed.checkpoint,
        resume_state=resumed.resume_state,
    )


def resumed_from_proto(msg: trainer_pb2.RollbackResponse) -> Resumed:
    return Resumed(msg.step, msg.policy_version, msg.checkpoint, bytes(msg.resume_state))
