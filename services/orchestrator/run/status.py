"""The OrchestratorService: the run's live status (`rlrun.common.wire.orchestrator.RunStatus`),
which the operator and `rlrun local` poll with GetStatus; Stop ends the run, or the process
once the run has finished."""

from __future__ import annotations

from collections.abc import Callable

from rlrun.common.errors import grpc_errors
from rlrun.common.wire import orchestrator as wire
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.v1 import orchestrator_pb2_grpc

SERVICE_NAME = wire.SERVICE_NAME


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    def __init__(self, status: RunStatus, stop: Callable[[str], None]):
        self.status = status
        self.stop = stop

    @grpc_errors
    async def GetStatus(self, request, context):
        return wire.status_to_proto(self.status)

    @grpc_errors
    async def Stop(self, request, context):
        self.stop(wire.stop_request_from_proto(request) or "requested through Stop")
        return wire.stop_response_to_proto(self.status.phase)
