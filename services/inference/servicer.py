"""The gRPC InferenceService: proto in, engine call, proto out. All logic lives in the engine
(and, for the text-level RPCs, in text_path)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from rlrun.common.errors import grpc_errors
from rlrun.common.model.weights import LayoutCache
from rlrun.common.wire.sampling import sampling_from_proto
from rlrun.inference import metrics
from rlrun.inference.engines.base import Completion, Engine, QueueFullError, check_version_order
from rlrun.inference.text_path import TextPath
from rlrun.inference.validation import check_score, check_token_ids
from rlrun.inference.weight_stream import StreamBroken, receive_update
from rlrun.v1 import inference_pb2, inference_pb2_grpc, weights_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name

_FINISH_TO_PB = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
    "abort": inference_pb2.FINISH_REASON_ABORT,
}


def completion_to_proto(completion: Completion) -> inference_pb2.Completion:
    return inference_pb2.Completion(
        token_ids=completion.token_ids,
        logprobs=completion.logprobs,
        finish_reason=_FINISH_TO_PB[completion.finish_reason],
        policy_version_start=completion.policy_version_start,
        policy_version_end=completion.policy_version_end,
    )


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        engine: Engine,
        text: TextPath,
        on_weights_applied: Callable[[int], None] = lambda version: None,
        not_ready: Callable[[], str | None] = lambda: None,
    ):
        """`text`: the text-level RPCs, over the tokenizer the model was loaded with;
        `not_ready()`: why this replica may not generate yet (None: it may)."""
        self.engine = engine
        self.text = text
        self.on_weights_applied = on_weights_applied
        self.not_ready = not_ready
        # One update at a time: each holds a full copy of the weights while it assembles.
        self._update_lock = asyncio.Lock()
        self._layout_cache: LayoutCache | None = None

    def _layouts(self) -> LayoutCache:
        specs = self.engine.weight_specs()
        if self._layout_cache is None or self._layout_cache.expected is not specs:
            self._layout_cache = LayoutCache(specs)
        return self._layout_cache

    async def _admit(self, context) -> None:
        if (reason := self.not_ready()) is not None:
            # UNAVAILABLE: callers retry elsewhere or later; a rollout from a replica that
            # restarted with its initial weights would only be dropped as stale.
            await context.abort(grpc.StatusCode.UNAVAILABLE, reason)

    async def _generate(self, context, prompt: list[int], params, request_id: str) -> list[Completion]:
        try:
            return await self.engine.generate(prompt, params, request_id)
        except QueueFullError as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))

    @grpc_errors
    async def Generate(self, request, context):
        await self._admit(context)
        prompt = list(request.prompt_token_ids)
        check_token_ids(prompt, "prompt_token_ids", self.engine.vocab_size, self.engine.max_model_len - 1)
        params = sampling_from_proto(
            request.sampling,
            "sampling",
            vocab_size=self.engine.vocab_size,
            max_model_len=self.engine.max_model_len,
            prompt_len=len(prompt),
            max_samples=self.engine.max_samples,
        )
        completions = await self._generate(context, prompt, params, request.request_id)
        return inference_pb2.GenerateResponse(
            completions=[completion_to_proto(c) for c in completions], prompt_tokens=len(prompt)
        )

    @grpc_errors
    async def GenerateChat(self, request, context):
        await self._admit(context)
        rendered = self.text.render(request.messages, add_generation_prompt=True)
        prompt = list(rendered.token_ids)
        params = sampling_from_proto(
            request.sampling,
            "sampling",
            vocab_size=self.engine.vocab_size,
            max_samples=self.engine.max_samples,
        )
        params = self.text.chat_sampling(params, prompt, self.engine.max_model_len)
        completions = await self._generate(context, prompt, params, request.request_id)
        return inference_pb2.GenerateChatResponse(
            prompt=rendered,
            completions=[self.text.chat_completion(c, completion_to_proto(c)) for c in completions],
        )

    @grpc_errors
    async def RenderChat(self, request, context):
        return self.text.render(request.messages, request.add_generation_prompt)

    @grpc_errors
    async def Tokenize(self, request, context):
        return inference_pb2.TokenizeResponse(token_ids=self.text.tokenize(request.text))

    @grpc_errors
    async def Detokenize(self, request, context):
        text = self.text.detokenize(list(request.token_ids), request.skip_special_tokens)
        return inference_pb2.DetokenizeResponse(text=text)

    @grpc_errors
    async def Score(self, request, context):
        token_ids = list(request.token_ids)
        check_score(
            token_ids,
            request.start,
            request.temperature,
            vocab_size=self.engine.vocab_size,
            max_model_len=self.engine.max_model_len,
        )
        result = await self.engine.score(token_ids, request.start, request.temperature)
        return inference_pb2.ScoreResponse(logprobs=result.logprobs, policy_version=result.policy_version)

    @grpc_errors
    async def UpdateWeights(self, request_iterator, context):
        async with self._update_lock:
            started = time.perf_counter()
            try:
                update = await receive_update(
                    request_iterator, self._layouts(), await self.engine.weight_receive_buffer()
                )
                if not update.header.rollback:
                    check_version_order(update.header.version, self.engine.policy_version)
                if update.header.transport == weights_pb2.WEIGHT_TRANSPORT_IPC:
                    apply_seconds = await self.engine.receive_weights_ipc(update.header)
                elif update.tensors is None:
                    apply_seconds = await self.engine.receive_weights_nccl(update.header)
                else:
                    apply_seconds = await self.engine.update_weights(update.tensors, update.header.version)
            except StreamBroken as error:
                metrics.WEIGHT_UPDATE_FAILURES.inc()
                log.warning("UpdateWeights aborted: %s", error)
                await context.abort(grpc.StatusCode.ABORTED, f"chunks: {error}")
            except BaseException:
                metrics.WEIGHT_UPDATE_FAILURES.inc()
                raise
            version = update.header.version
            seconds = time.perf_counter() - started
            metrics.WEIGHT_UPDATE_SECONDS.observe(seconds)
            metrics.WEIGHT_UPDATE_BYTES.inc(update.bytes_received)
            self.on_weights_applied(version)
            # Logged once the reply is out: the trainer need not wait for a log write.
            context.add_done_callback(
                lambda _: log.info(
                    "weights of version %d (%d bytes) received and committed in %.2f ms (the commit %.2f ms)",
                    version,
                    update.bytes_received,
                    seconds * 1e3,
                    apply_seconds * 1e3,
                )
            )
            return inference_pb2.UpdateWeightsResponse(
                version=version, bytes_received=update.bytes_received, apply_seconds=apply_seconds
            )

    @grpc_errors
    async def GetStatus(self, request, context):
        status = self.engine.status()
        return inference_pb2.GetInferenceStatusResponse(
            policy_version=status.policy_version,
            running_requests=status.running_requests,
            waiting_requests=status.waiting_requests,
            tokens_per_s=status.tokens_per_s,
            paused=status.paused,
            model=status.model,
            engine=status.engine,
            max_model_len=status.max_model_len,
            tokenizer=self.text.info,
            weight_sync=self.engine.weight_sync_info(),
        )

    @grpc_errors
    async def Pause(self, request, context):
        await self.engine.pause()
        return inference_pb2.PauseResponse(paused=True)

    @grpc_errors
    async def Resume(self, request, context):
        await self.engine.resume()
        return inference_pb2.ResumeResponse(paused=False)
