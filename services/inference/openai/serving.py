"""The OpenAI-compatible API's logic over an engine, without HTTP: a request model in, a body
(a dict) or a stream of chunks (dicts) out. Bad input raises `RequestError` (400, naming the
field), a model not served `ModelNotFound` (404), a full queue `QueueFullError` (429): the
app (`app`) turns them into OpenAI's error bodies.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from rlrun.common.aio import all_or_nothing
from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.inference import Completion, FinishReason, TopLogprobs
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference.batch_calls import primed_streams
from rlrun.inference.engines.base import Engine
from rlrun.inference.openai.prompts import PromptBuilder, chat_prompts, completion_prompts
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelNotFound
from rlrun.inference.openai.request_params import generation_requests, stop_strings, text_stop_strings
from rlrun.inference.openai.responses import Echo, best_of_each, chat_body, completion_body, now
from rlrun.inference.openai.streaming import (
    CHAT_STREAM,
    COMPLETION_STREAM,
    StreamFormat,
    no_deltas,
    stream_chunks,
)
from rlrun.inference.openai.text import TextStream
from rlrun.inference.openai.tool_parsers import ToolCallParser
from rlrun.inference.params import GenerationParams
from rlrun.inference.structured import GrammarCompiler

Answer = dict[str, Any] | AsyncIterator[dict[str, Any]]
"""A whole body, or (`stream: true`) the chunks of a stream."""

Requests = list[tuple[list[int], GenerationParams]]

DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's `max_tokens` of a completion that sets none (a chat's is the rest of the context)."""


class OpenAIServing:
    """/v1/models, /v1/completions (with `echo`) and /v1/chat/completions over `engine`."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        model_id: str,
        limits: RequestLimits,
        tool_parser: type[ToolCallParser],
    ):
        """`limits`: what one request may ask for; `tool_parser`: the format the chat answers'
        tool calls are read in."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.limits = limits
        self.tool_parser = tool_parser
        self.grammars = GrammarCompiler(lambda: tokenizer)

    # -- models --------------------------------------------------------------------------------

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": now(),
            "owned_by": "rlrun",
            "max_model_len": self.engine.max_model_len,
        }

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    async def model(self, model: str) -> dict[str, Any]:
        self.check_model(model)
        return self.model_card()

    def check_model(self, model: str | None) -> None:
        """One model is served: an absent `model` means it."""
        if model is not None and model != self.model_id:
            raise ModelNotFound(model, self.model_id)

    # -- generation ----------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest) -> Answer:
        max_tokens = DEFAULT_COMPLETION_TOKENS if body.max_tokens is None else body.max_tokens
        if not body.echo:
            requests = self._requests(body, completion_prompts, max_tokens)
            return await self._generated(body, requests, COMPLETION_STREAM, completion_body)
        # max_tokens 0 asks for the prompt alone; the checks still want room for a token.
        requests = self._requests(body, completion_prompts, max_tokens or 1)
        return await self._echoed(body, requests, max_tokens)

    async def chat(self, body: ChatCompletionRequest) -> Answer:
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        requests = self._requests(body, chat_prompts, max_tokens)
        return await self._generated(
            body, requests, CHAT_STREAM, functools.partial(chat_body, parser=self.tool_parser)
        )

    def _requests(self, body, build_prompts: PromptBuilder, max_tokens: int | None) -> Requests:
        self.check_model(body.model)
        return generation_requests(
            body, build_prompts, max_tokens, self.engine, self.tokenizer, self.grammars, self.limits
        )

    async def _generated(self, body, requests: Requests, form: StreamFormat, full_body: Callable) -> Answer:
        """The answer of a request to generate: its stream, or `full_body` of its completions."""
        prompt_tokens = _prompt_tokens(requests)
        if body.stream:
            first, rest = await primed_streams(self.engine, requests)
            choices = len(requests) * body.n
            return stream_chunks(
                form,
                self.tokenizer,
                self.model_id,
                body,
                choices,
                prompt_tokens,
                first,
                rest,
                self.tool_parser,
            )
        generate = self._generator(body)
        results = await all_or_nothing([generate(prompt, params) for prompt, params in requests])
        completions = [completion for result in results for completion in best_of_each(result, body.n)]
        return full_body(body, self.tokenizer, self.model_id, prompt_tokens, completions)

    async def _echoed(self, body: CompletionRequest, requests: Requests, max_tokens: int) -> Answer:
        """The answer of an `echo` request: each prompt before its completions, whole or
        streamed; max_tokens 0 generates nothing."""
        prompt_tokens = _prompt_tokens(requests)
        scoring = [self._prompt_echo(prompt, params.top_logprobs) for prompt, params in requests]
        if body.stream:
            # The prompts are scored before the streams open, so that nothing streams yet
            # when a prompt cannot be scored.
            echoes = await all_or_nothing(scoring)
            first, rest = await primed_streams(self.engine, requests) if max_tokens else (None, no_deltas())
            choices = [echo for echo in echoes for _ in range(body.n)]
            return stream_chunks(
                COMPLETION_STREAM,
                self.tokenizer,
                self.model_id,
                body,
                len(choices),
                prompt_tokens,
                first,
                rest,
                self.tool_parser,
                choices,
            )
        generate = self._generator(body)
        # Tasks, so that each kind of result is read back with its own type.
        scored = [asyncio.ensure_future(call) for call in scoring]
        generated = (
            [asyncio.ensure_future(generate(prompt, params)) for prompt, params in requests]
            if max_tokens
            else []
        )
        await all_or_nothing([*scored, *generated])
        echoes = [task.result() for task in scored]
        per_prompt = [task.result() for task in generated]
        if not max_tokens:
            version = self.engine.policy_version
            per_prompt = [
                [Completion([], [], "length", version, version, [] if params.top_logprobs else None)] * body.n
                for _, params in requests
            ]
        choices = [echo for echo in echoes for _ in range(body.n)]
        completions = [completion for result in per_prompt for completion in best_of_each(result, body.n)]
        return completion_body(body, self.tokenizer, self.model_id, prompt_tokens, completions, choices)

    async def _prompt_echo(self, prompt: list[int], top: int) -> Echo:
        """A prompt's own logprobs (temperature 1, as OpenAI's echo); its first token has none."""
        if len(prompt) == 1:
            return Echo(prompt, [None], [None] if top else None)
        score = await self.engine.score(prompt, 1, 1.0, top)
        return Echo(
            prompt,
            [None, *score.logprobs],
            None if score.top_logprobs is None else [None, *score.top_logprobs],
        )

    def _generator(self, body) -> Callable[[list[int], GenerationParams], Awaitable[list[Completion]]]:
        """engine.generate, or where stop sequences of several tokens need the text to be
        watched, `until_stopped` over the engine's stream."""
        if not text_stop_strings(body, self.tokenizer):
            return self.engine.generate
        stops = stop_strings(body)
        return lambda prompt, params: until_stopped(
            self.engine, self.tokenizer, prompt, params, stops, body.min_tokens
        )


def _prompt_tokens(requests: Requests) -> int:
    return sum(len(prompt) for prompt, _ in requests)


async def until_stopped(
    engine: Engine,
    tokenizer: Tokenizer,
    prompt: list[int],
    params: GenerationParams,
    stops: Sequence[str],
    min_tokens: int,
) -> list[Completion]:
    """The completions of a request whose samples end at a stop sequence the engine cannot
    see (several tokens long): its stream, watched as text, closed (so the request leaves the
    engine) once every sample has stopped or finished."""
    version_start = engine.policy_version
    samples = range(params.n)
    texts = [TextStream(tokenizer, stops, min_tokens) for _ in samples]
    token_ids: list[list[int]] = [[] for _ in samples]
    logprobs: list[list[float]] = [[] for _ in samples]
    tops: list[list[TopLogprobs] | None] = [[] if params.top_logprobs else None for _ in samples]
    reasons: list[FinishReason | None] = [None] * params.n
    stream = engine.stream(prompt, params)
    try:
        async for deltas in stream:
            for delta in deltas:
                i = delta.index
                if reasons[i] is not None:
                    continue
                token_ids[i] += delta.token_ids
                logprobs[i] += delta.logprobs
                top = tops[i]
                if top is not None:
                    # asked for (params.top_logprobs): the engine reports them with every delta
                    assert delta.top_logprobs is not None
                    top += delta.top_logprobs
                texts[i].push(delta.token_ids)
                reasons[i] = "stop" if texts[i].stopped else delta.finish_reason
            if None not in reasons:
                break
    finally:
        await stream.aclose()
    version = engine.policy_version
    return [
        Completion(token_ids[i], logprobs[i], reasons[i] or "abort", version_start, version, tops[i])
        for i in samples
    ]
