"""TrainerService over gRPC: proto in, validation, `TrainerRuntime`, proto out.

A malformed batch gets INVALID_ARGUMENT naming the field, a batch for the wrong step gets
FAILED_PRECONDITION naming expected and got; neither reaches training. A rollback with no
checkpoint to go back to gets FAILED_PRECONDITION naming max_step.
"""

from __future__ import annotations

import grpc

from rlrun.common.errors import RequestError, grpc_errors
from rlrun.common.wire import trainer as wire
from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.training import TrainingBatch
from rlrun.trainer.packing import count_channel_tokens
from rlrun.trainer.runtime import NoCheckpoint, StepMismatch, TrainerRuntime
from rlrun.v1 import trainer_pb2_grpc

SERVICE_NAME = wire.SERVICE_NAME


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
    def __init__(
        self, runtime: TrainerRuntime, vocab_size: int, micro_batch_tokens: int, limits: RequestLimits
    ):
        self.runtime = runtime
        self.vocab_size = vocab_size
        self.micro_batch_tokens = micro_batch_tokens
        self.limits = limits

    @grpc_errors
    async def SubmitBatch(self, request, context):
        batch, orchestrator_state = wire.submit_request_from_proto(
            request, limits=self.limits, vocab_size=self.vocab_size
        )
        check_trainable(batch, self.micro_batch_tokens)
        try:
            result = await self.runtime.submit(batch, orchestrator_state)
        except StepMismatch as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        return wire.step_result_to_proto(result)

    @grpc_errors
    async def GetStatus(self, request, context):
        runtime = self.runtime
        return wire.status_to_proto(
            wire.TrainerStatus(
                step=runtime.step,
                policy_version=runtime.version,
                world_size=runtime.world_size,
                last_checkpoint=runtime.last_checkpoint,
                last_metrics=runtime.last_metrics,
                resume_state=runtime.resume_state,
            )
        )

    @grpc_errors
    async def SaveCheckpoint(self, request, context):
        asked = wire.save_request_from_proto(request)
        try:
            path, step = await self.runtime.save(asked.extra_state, asked.step)
        except StepMismatch as error:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, str(error).replace("batch.step", "step", 1)
            )
        return wire.saved_to_proto(str(path), step)

    @grpc_errors
    async def Rollback(self, request, context):
        try:
            resumed = await self.runtime.rollback(wire.rollback_request_from_proto(request))
        except NoCheckpoint as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"max_step: {error}")
        return wire.resumed_to_proto(resumed)
