"""The gRPC InferenceService: proto in, engine call, proto out. All logic lives in the engine
(and, for the text-level RPCs, in text_path)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import grpc

from rlrun.common.errors import grpc_errors
from rlrun.common.weights.grpc_stream import LayoutCache, StreamBroken, receive_update
from rlrun.common.wire import inference as wire
from rlrun.common.wire.inference import Completion
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference import metrics
from rlrun.inference.engines.base import Engine, QueueFullError, check_version_order
from rlrun.inference.text_path import TextPath
from rlrun.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = wire.SERVICE_NAME


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        engine: Engine,
        text: TextPath,
        limits: RequestLimits,
        on_weights_applied: Callable[[int], None] = lambda version: None,
        not_ready: Callable[[], str | None] = lambda: None,
    ):
        """`text`: the text-level RPCs, over the tokenizer the model was loaded with;
        `limits`: what one request may ask for; `not_ready()`: why this replica may not
        generate yet (None: it may)."""
        self.engine = engine
        self.text = text
        self.limits = limits
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
        engine = self.engine
        asked = wire.generate_request_from_proto(
            request,
            vocab_size=engine.vocab_size,
            max_model_len=engine.max_model_len,
            limits=self.limits,
        )
        completions = await self._generate(context, asked.prompt_token_ids, asked.sampling, asked.request_id)
        return wire.generate_response_to_proto(completions, len(asked.prompt_token_ids))

    @grpc_errors
    async def GenerateChat(self, request, context):
        await self._admit(context)
        asked = wire.generate_chat_request_from_proto(
            request, vocab_size=self.engine.vocab_size, limits=self.limits
        )
        rendered = self.text.render(asked.messages, add_generation_prompt=True)
        prompt = rendered.token_ids
        params = self.text.chat_sampling(asked.sampling, prompt, self.engine.max_model_len)
        completions = await self._generate(context, prompt, params, asked.request_id)
        return wire.generate_chat_response_to_proto(
            rendered, [self.text.chat_completion(c) for c in completions]
        )

    @grpc_errors
    async def RenderChat(self, request, context):
        asked = wire.render_chat_request_from_proto(request, self.limits)
        return wire.rendered_chat_to_proto(self.text.render(asked.messages, asked.add_generation_prompt))

    @grpc_errors
    async def Tokenize(self, request, context):
        text = wire.tokenize_request_from_proto(request, self.limits)
        return wire.tokenize_response_to_proto(self.text.tokenize(text))

    @grpc_errors
    async def Detokenize(self, request, context):
        asked = wire.detokenize_request_from_proto(request, self.engine.max_model_len)
        return wire.detokenize_response_to_proto(
            self.text.detokenize(asked.token_ids, asked.skip_special_tokens)
        )

    @grpc_errors
    async def Score(self, request, context):
        asked = wire.score_request_from_proto(
            request, vocab_size=self.engine.vocab_size, max_model_len=self.engine.max_model_len
        )
        result = await self.engine.score(asked.token_ids, asked.start, asked.temperature)
        return wire.score_response_to_proto(result)

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
                if update.header.transport == "ipc":
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
            return wire.weights_applied_to_proto(
                wire.WeightsApplied(version, update.bytes_received, apply_seconds)
            )

    @grpc_errors
    async def GetStatus(self, request, context):
        status = dataclasses.replace(
            self.engine.status(), tokenizer=self.text.info, weight_sync=self.engine.weight_sync_info()
        )
        return wire.status_to_proto(status)

    @grpc_errors
    async def Pause(self, request, context):
        await self.engine.pause()
        return wire.pause_response_to_proto(True)

    @grpc_errors
    async def Resume(self, request, context):
        await self.engine.resume()
        return wire.resume_response_to_proto(False)
