"""Logprobs of given tokens under a model (InferenceService.Score), for env-owned algorithms
that score with a reference model. Channels are opened once per replica and spread round-robin."""

from __future__ import annotations

import itertools

from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.v1 import inference_pb2, inference_pb2_grpc


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
        reply = await self._stub(address).Score(
            inference_pb2.ScoreRequest(token_ids=token_ids, start=start, temperature=temperature)
        )
        return list(reply.logprobs)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
