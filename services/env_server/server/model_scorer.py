"""Logprobs of given tokens under a model (InferenceService.Score), for env-owned algorithms
that score with a reference model. Channels are opened once per replica and spread round-robin."""

from __future__ import annotations

import itertools

from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.wire.inference import ScoreRequest, score_request_to_proto, score_response_from_proto
from rlrun.v1 import inference_pb2_grpc


class ModelScorer:
    def __init__(self, options: ClientOptions):
        self.options = options
        self._stubs: dict[str, inference_pb2_grpc.InferenceServiceStub] = {}
        self._channels: list = []
        self._turn = itertools.count()

    def _stub(self, address: str) -> inference_pb2_grpc.InferenceServiceStub:
        if address not in self._stubs:
            channel = open_channel(address, self.options)
            self._channels.append(channel)
            self._stubs[address] = inference_pb2_grpc.InferenceServiceStub(channel)
        return self._stubs[address]

    async def __call__(
        self, addresses: list[str], token_ids: list[int], start: int, temperature: float
    ) -> list[float]:
        address = addresses[next(self._turn) % len(addresses)]
        request = ScoreRequest(token_ids, start, temperature)
        reply = await self._stub(address).Score(score_request_to_proto(request))
        return score_response_from_proto(reply, request, f"Score on {address}").logprobs

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
