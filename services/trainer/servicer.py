"""TrainerService over gRPC: proto in, validation, `TrainerRuntime`, proto out.

A malformed batch gets INVALID_ARGUMENT naming the field, a batch for the wrong step gets
FAILED_PRECONDITION naming expected and got; neither reaches training. A rollback with no
checkpoint to go back to gets FAILED_PRECONDITION naming max_step.
"""

from __future__ import annotations

import grpc

from rlrun.common.errors import RequestError, grpc_errors
from rlrun.common.wire.training import TrainingBatch, batch_from_proto
from rlrun.trainer.packing import count_channel_tokens
from rlrun.trainer.runtime import NoCheckpoint, StepMismatch, TrainerRuntime
from rlrun.v1 import trainer_pb2, trainer_pb2_grpc

SERVICE_NAME = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name


def check_trainable(batch: TrainingBatch, micro_batch_tokens: int, where: str = "batch") -> None:
    """Every sample must fit one micro-batch (samples are never split), and some token must
    train: a batch with nothing to learn would still move the weights (AdamW momentum, decay)."""
    for i, sample in enumerate(batch.samples):
        if len(sample.token_ids) > micro_batch_tokens:
            raise RequestError(
                f"{where}.samples[{i}].token_ids",
                f"has {len(sample.token_ids)} tokens, more than trainer.micro_batch_tokens ({micro_batch_tokens})",
            )
    if count_channel_tokens(batch.samples).trained == 0:
        raise RequestError(
            f"{where}.samples",
            "no token trains: every sample needs a masked-in token after its first under an rl or ce channel",
        )


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, runtime: TrainerRuntime, vocab_size: int, micro_batch_tokens: int):
        self.runtime = runtime
        self.vocab_size = vocab_size
        self.micro_batch_tokens = micro_batch_tokens

    @grpc_errors
    async def SubmitBatch(
        self, request: trainer_pb2.SubmitBatchRequest, context
    ) -> trainer_pb2.SubmitBatchResponse:
        batch = batch_from_proto(request.batch, "batch", vocab_size=self.vocab_size)
        check_trainable(batch, self.micro_batch_tokens)
        try:
            outcome = await self.runtime.submit(batch, request.orchestrator_state)
        except StepMismatch as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        result = outcome.result
        return trainer_pb2.SubmitBatchResponse(
            step=result.step,
            policy_version=result.version,
            skipped=result.skipped,
            skip_reason=result.skip_reason,
            metrics=result.metrics,
            broadcasts=[b.to_proto() for b in outcome.broadcasts],
        )

    @grpc_errors
    async def GetStatus(self, request, context) -> trainer_pb2.GetTrainerStatusResponse:
        runtime = self.runtime
        return trainer_pb2.GetTrainerStatusResponse(
            step=runtime.step,
            policy_version=runtime.version,
            world_size=runtime.world_size,
            last_checkpoint=runtime.last_checkpoint,
            last_metrics=runtime.last_metrics,
            resume_state=runtime.resume_state,
        )

    @grpc_errors
    async def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context
    ) -> trainer_pb2.SaveCheckpointResponse:
        try:
            path, step = await self.runtime.save(
                request.extra_state, request.step if request.HasField("step") else None
            )
        except StepMismatch as error:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, str(error).replace("batch.step", "step", 1)
            )
        return trainer_pb2.SaveCheckpointResponse(path=str(path), step=step)

    @grpc_errors
    async def Rollback(self, request: trainer_pb2.RollbackRequest, context) -> trainer_pb2.RollbackResponse:
        try:
            outcome = await self.runtime.rollback(request.max_step if request.max_step >= 0 else None)
        except NoCheckpoint as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"max_step: {error}")
        return trainer_pb2.RollbackResponse(
            step=outcome.step,
            policy_version=outcome.version,
            checkpoint=outcome.checkpoint,
            resume_state=outcome.resume_state,
        )
