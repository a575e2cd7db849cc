"""Async token-in/token-out client of the InferenceService, spread over replicas."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Sequence

import grpc
import grpc.aio

from rlrun.common.grpc_client import ClientOptions, UnavailableBackoff, open_channel
from rlrun.common.types import SamplingParams
from rlrun.common.wire import sampling_to_proto
from rlrun.env_server.sdk.completion import Completion
from rlrun.env_server.sdk.errors import InvalidModelOutput, ModelCallError
from rlrun.v1 import inference_pb2, inference_pb2_grpc

_FINISH = {inference_pb2.FINISH_REASON_STOP: "stop", inference_pb2.FINISH_REASON_LENGTH: "length"}


def completions_from_proto(
    response: inference_pb2.GenerateResponse, n: int, address: str
) -> list[Completion]:
    """Checks the token contract of a GenerateResponse; a broken one is InvalidModelOutput.

    Token ids are only checked to be non-negative: a model's vocabulary is often padded beyond
    its tokenizer's, and ids from the padding are still valid model output (they decode to
    nothing and train like any other token)."""
    if len(response.completions) != n:
        raise InvalidModelOutput(f"{address} returned {len(response.completions)} completions for n = {n}")
    out = []
    for i, c in enumerate(response.completions):
        at = f"{address} completions[{i}]"
        if c.finish_reason == inference_pb2.FINISH_REASON_ABORT:
            raise ModelCallError("ABORTED", f"Generate on {address}: the request was aborted", retryable=True)
        if c.finish_reason not in _FINISH:
            raise InvalidModelOutput(f"{at} has no finish reason")
        if len(c.logprobs) != len(c.token_ids):
            raise InvalidModelOutput(f"{at} has {len(c.logprobs)} logprobs for {len(c.token_ids)} tokens")
        if any(t < 0 for t in c.token_ids):
            raise InvalidModelOutput(f"{at} has a negative token id")
        if any(not (math.isfinite(lp) and lp <= 0.0) for lp in c.logprobs):
            raise InvalidModelOutput(f"{at} has a logprob that is not a finite number <= 0")
        if c.policy_version_start > c.policy_version_end:
            raise InvalidModelOutput(f"{at} policy_version_start > policy_version_end")
        out.append(
            Completion(
                list(c.token_ids),
                list(c.logprobs),
                _FINISH[c.finish_reason],  # type: ignore[arg-type]
                c.policy_version_start,
                c.policy_version_end,
            )
        )
    return out


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
        request = inference_pb2.GenerateRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, sampling=sampling_to_proto(sampling)
        )
        backoff = UnavailableBackoff(self.unavailable_retry_s)
        failed: set[str] = set()
        while True:
            address = self.pick(addresses, frozenset(failed))
            self.in_flight[address] += 1
            try:
                response = await self._stub(address).Generate(request)
                return completions_from_proto(response, sampling.n, address)
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

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
