"""Async token-in/token-out client of the InferenceService, spread over replicas."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import grpc
import grpc.aio

from rlrun.common.grpc_client import ClientOptions, UnavailableBackoff, open_channel
from rlrun.common.wire import WireError
from rlrun.common.wire.inference import (
    Completion,
    GenerateRequest,
    InferenceStatus,
    generate_request_to_proto,
    generate_response_from_proto,
    status_from_proto,
    status_request,
)
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError
from rlrun.v1 import inference_pb2_grpc


def completions_from_proto(response, n: int, address: str) -> list[Completion]:
    """The reply's completions under the token contract (`generate_response_from_proto`): a
    broken one is InvalidModelOutput, an aborted one a retryable ModelCallError."""
    try:
        completions = generate_response_from_proto(response, n, address)
    except WireError as error:
        raise InvalidModelOutput(error.message) from None
    if any(c.finish_reason == "abort" for c in completions):
        raise ModelCallError("ABORTED", f"Generate on {address}: the request was aborted", retryable=True)
    return completions


class InferenceClient:
    """One channel per replica address, opened on first use. Each call goes to the replica
    with the fewest calls in flight from this client; ties rotate. A call a replica answers
    UNAVAILABLE (it died, restarts, or waits for the live weights) goes to another one, or to
    the same once it is back, for `unavailable_retry_s` in all."""

    def __init__(self, options: ClientOptions = ClientOptions(), unavailable_retry_s: float = 120.0):
        self.options = options
        self.unavailable_retry_s = unavailable_retry_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, inference_pb2_grpc.InferenceServiceStub] = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self._turn = 0

    def pick(self, addresses: Sequence[str], avoid: frozenset[str] = frozenset()) -> str:
        """`avoid`: replicas that just failed, skipped while another one is left."""
        if not addresses:
            raise ValueError("no inference addresses to pick from")
        addresses = [a for a in addresses if a not in avoid] or list(addresses)
        fewest = min(self.in_flight[a] for a in addresses)
        candidates = [a for a in addresses if self.in_flight[a] == fewest]
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def _stub(self, address: str) -> inference_pb2_grpc.InferenceServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            self._channels[address] = open_channel(address, self.options)
            stub = self._stubs[address] = inference_pb2_grpc.InferenceServiceStub(self._channels[address])
        return stub

    async def generate(
        self, addresses: Sequence[str], prompt_ids: list[int], sampling: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        request = generate_request_to_proto(GenerateRequest(prompt_ids, sampling, request_id))
        backoff = UnavailableBackoff(self.unavailable_retry_s)
        failed: set[str] = set()
        while True:
            address = self.pick(addresses, frozenset(failed))
            self.in_flight[address] += 1
            try:
                return completions_from_proto(
                    await self._stub(address).Generate(request), sampling.n, address
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise ModelCallError.from_rpc(error, address) from None
                failed.add(address)
                if len(failed) < len(set(addresses)):
                    continue  # another replica right away
                delay = backoff.next_delay()
                if delay is None:
                    raise ModelCallError.from_rpc(error, address) from None
                failed.clear()
                await asyncio.sleep(delay)
            finally:
                self.in_flight[address] -= 1

    async def status(self, address: str) -> InferenceStatus:
        """One replica's GetStatus."""
        return status_from_proto(await self._stub(address).GetStatus(status_request()))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
