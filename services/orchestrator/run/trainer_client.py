"""Client of the trainer (TrainerService).

Every call but SubmitBatch waits out a trainer that is restarting (UNAVAILABLE, for
`grpc.unavailable_retry_s`). SubmitBatch is not retried here: when it fails the batch may or
may not have trained, so the run resumes from the trainer's checkpoint instead (TrainerLost).
"""

from __future__ import annotations

import grpc

from rlrun.common.grpc_client import ClientOptions, call_while_unavailable, open_channel
from rlrun.common.wire import trainer as wire
from rlrun.common.wire.trainer import Resumed, StepResult
from rlrun.common.wire.training import EncodedSamples
from rlrun.v1 import trainer_pb2_grpc

LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})
"""SubmitBatch failures that mean the trainer is not where the run left it: it is gone (a
restart in progress) or it is at another step (it restarted from a checkpoint)."""


class TrainerLost(RuntimeError):
    """The trainer died or restarted while a batch was being trained."""


class TrainerClient:
    def __init__(self, address: str, options: ClientOptions, unavailable_retry_s: float):
        self.address = address
        self.channel = open_channel(address, options)
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self.channel)
        self.unavailable_retry_s = unavailable_retry_s

    async def submit(
        self,
        batch: EncodedSamples,
        *,
        step: int,
        version: int,
        learning_rate: float | None,
        metrics: dict[str, float],
        orchestrator_state: bytes,
    ) -> StepResult:
        """Trains `batch` as step `step` at policy `version` (None: the configured learning
        rate); returns after the step and the weight broadcast; raises TrainerLost."""
        request = wire.submit_request_to_proto(
            wire.SubmitBatch(batch, step, version, learning_rate, metrics, orchestrator_state)
        )
        try:
            return wire.step_result_from_proto(await self.stub.SubmitBatch(request))
        except grpc.aio.AioRpcError as error:
            if error.code() in LOST_CODES:
                raise TrainerLost(
                    f"SubmitBatch of step {step}: {error.code().name}: {error.details()}"
                ) from None
            raise

    async def rollback(self, max_step: int | None) -> Resumed:
        """Back to the trainer's newest checkpoint at or before `max_step` (None: newest)."""
        request = wire.rollback_request_to_proto(max_step)
        return wire.resumed_from_proto(
            await call_while_unavailable(
                lambda: self.stub.Rollback(request),
                self.unavailable_retry_s,
                f"trainer {self.address} Rollback",
            )
        )

    async def save_checkpoint(self, extra_state: bytes, step: int) -> str:
        """Saves `extra_state` with the trainer's weights of `step`; raises TrainerLost when the
        trainer is at another step."""
        request = wire.save_request_to_proto(wire.SaveCheckpoint(extra_state, step))
        try:
            return wire.saved_from_proto(
                await call_while_unavailable(
                    lambda: self.stub.SaveCheckpoint(request),
                    self.unavailable_retry_s,
                    f"trainer {self.address} SaveCheckpoint",
                )
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in LOST_CODES:
                raise TrainerLost(
                    f"SaveCheckpoint at step {step}: {error.code().name}: {error.details()}"
                ) from None
            raise

    async def close(self) -> None:
        await self.channel.close()
