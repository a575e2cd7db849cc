"""Reference scoring through InferenceService.Score, spread over a target's replicas and
bounded by its concurrency cap (opd, opsd)."""

from __future__ import annotations

import asyncio
import itertools

from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.wire.inference import ScoreRequest, score_request_to_proto, score_response_from_proto
from rlrun.v1 import inference_pb2_grpc


class InferenceScorer:
    def __init__(self, name: str, addresses: list[str], options: ClientOptions, max_concurrency: int):
        if not addresses:
            raise ValueError(f"model target {name!r} has no replica to score with")
        self.name = name
        self.channels = [open_channel(address, options) for address in addresses]
        self._stubs = itertools.cycle([inference_pb2_grpc.InferenceServiceStub(c) for c in self.channels])
        self._slots = asyncio.Semaphore(max_concurrency)

    async def score(self, token_ids: list[int], start: int, temperature: float) -> list[float]:
        request = ScoreRequest(token_ids, start, temperature)
        async with self._slots:
            reply = await next(self._stubs).Score(score_request_to_proto(request))
        return score_response_from_proto(reply, request, f"Score on {self.name!r}").logprobs

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels))
