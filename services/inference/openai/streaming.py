"""OpenAI's streamed answers: server-sent chunks of each choice's new text (and logprobs,
and for a chat its tool calls), as the engine's deltas arrive. A chat stream first announces
each choice's role; an `echo` stream sends each choice's prompt as its first chunk."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.inference import TopLogprobs
from rlrun.inference.engines.base import StreamDelta
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest
from rlrun.inference.openai.request_params import stop_strings
from rlrun.inference.openai.responses import (
    ChoiceFinishReason,
    Echo,
    chat_logprobs,
    completion_logprobs,
    new_id,
    now,
    usage,
)
from rlrun.inference.openai.text import TextStream
from rlrun.inference.openai.tool_calls import ForcedCalls, StreamedCalls
from rlrun.inference.openai.tool_parsers import ToolCallParser


def _completion_entry(
    tokenizer: Tokenizer,
    body: CompletionRequest | ChatCompletionRequest,
    index: int,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top: Sequence[TopLogprobs | None] | None,
    text: str,
    text_offset: int,
    finish_reason: ChoiceFinishReason | None,
) -> tuple[dict, int]:
    """A completion chunk's entry for tokens of choice `index`: new ones, or its echoed prompt
    (whose first token has no logprob)."""
    logprobs_body = None
    if body.logprobs is not None:
        logprobs_body = completion_logprobs(tokenizer, token_ids, logprobs, top, text_offset)
        text_offset += sum(len(token) for token in logprobs_body["tokens"])
    entry = {"index": index, "text": text, "logprobs": logprobs_body, "finish_reason": finish_reason}
    return entry, text_offset


def _completion_choice(
    tokenizer: Tokenizer,
    body: CompletionRequest,
    delta: StreamDelta,
    text: str,
    text_offset: int,
    finish_reason: ChoiceFinishReason | None,
) -> tuple[dict, int]:
    return _completion_entry(
        tokenizer,
        body,
        delta.index,
        delta.token_ids,
        delta.logprobs,
        delta.top_logprobs,
        text,
        text_offset,
        finish_reason,
    )


def _chat_choice(
    tokenizer: Tokenizer,
    body: ChatCompletionRequest,
    delta: StreamDelta,
    text: str,
    text_offset: int,
    finish_reason: ChoiceFinishReason | None,
) -> tuple[dict, int]:
    logprobs = None
    if body.logprobs:
        logprobs = chat_logprobs(tokenizer, delta.token_ids, delta.logprobs, delta.top_logprobs)
    entry = {
        "index": delta.index,
        "delta": {"content": text} if text else {},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    return entry, text_offset


@dataclass(frozen=True)
class StreamFormat:
    """How one endpoint's server-sent chunks look."""

    object: str
    id_prefix: str
    choice: Callable[[Tokenizer, Any, StreamDelta, str, int, ChoiceFinishReason | None], tuple[dict, int]]
    """A delta, the text it adds, where its tokens begin in the choice's text (completion
    logprobs' `text_offset`) and the choice's finish reason (None: it goes on) -> its entry in
    a chunk's `choices`, and where the next delta's tokens begin."""
    opens_with_role: bool
    """Chat streams first announce each choice's role."""


COMPLETION_STREAM = StreamFormat("text_completion", "cmpl", _completion_choice, opens_with_role=False)


CHAT_STREAM = StreamFormat("chat.completion.chunk", "chatcmpl", _chat_choice, opens_with_role=True)


def _call_finders(
    body: ChatCompletionRequest, choices: int, parser: type[ToolCallParser]
) -> list[StreamedCalls | ForcedCalls] | None:
    """What finds each choice's tool calls in its text as it streams (None: nothing does)."""
    mode = body.tool_mode()
    if mode == "none":
        return None
    if mode == "auto":
        tools = body.offered_tools()
        return [StreamedCalls(parser, tools, body.tool_call_limit()) for _ in range(choices)]
    return [ForcedCalls(body.forced_name()) for _ in range(choices)]


async def no_deltas() -> AsyncGenerator[list[StreamDelta], None]:
    return
    yield


async def stream_chunks(  # noqa: C901 - one branch per stream event kind
    form: StreamFormat,
    tokenizer: Tokenizer,
    model_id: str,
    body: CompletionRequest | ChatCompletionRequest,
    choices: int,
    prompt_tokens: int,
    first: list[StreamDelta] | None,
    rest: AsyncGenerator[list[StreamDelta], None],
    parser: type[ToolCallParser],
    echoes: Sequence[Echo] | None = None,
) -> AsyncIterator[dict]:
    """`first`: the first deltas (None: nothing is generated); `parser`: the format a chat
    answer's tool calls are read in; `echoes`: with `echo`, each choice's prompt, sent as its
    first chunk."""
    texts = [TextStream(tokenizer, stop_strings(body), body.min_tokens) for _ in range(choices)]
    calls = _call_finders(body, choices, parser) if isinstance(body, ChatCompletionRequest) else None
    ended = [False] * choices
    offsets = [0] * choices
    ident, created = new_id(form.id_prefix), now()

    def chunk(entries: list[dict], **extra) -> dict:
        return {
            "id": ident,
            "object": form.object,
            "created": created,
            "model": model_id,
            "choices": entries,
            **extra,
        }

    if form.opens_with_role:
        role = {"role": "assistant", "content": ""}
        yield chunk(
            [{"index": i, "delta": role, "logprobs": None, "finish_reason": None} for i in range(choices)]
        )

    def entry(delta: StreamDelta, piece: str, reason: ChoiceFinishReason | None) -> dict:
        choice, offsets[delta.index] = form.choice(
            tokenizer, body, delta, piece, offsets[delta.index], reason
        )
        return choice

    for index, echo in enumerate(echoes or ()):
        ended[index] = first is None
        prompt, offsets[index] = _completion_entry(
            tokenizer,
            body,
            index,
            echo.token_ids,
            echo.logprobs,
            echo.top,
            tokenizer.decode(echo.token_ids),
            offsets[index],
            "length" if first is None else None,
        )
        yield chunk([prompt])
    generated = 0
    batch = first
    try:
        while batch is not None:
            for delta in batch:
                text = texts[delta.index]
                if ended[delta.index]:  # stopped; the rest of its request is on its way out
                    continue
                generated += len(delta.token_ids)
                piece = text.push(delta.token_ids)
                reason: ChoiceFinishReason | None = "stop" if text.stopped else delta.finish_reason
                if reason is not None:
                    piece += text.finish()
                    ended[delta.index] = True
                if calls is None:
                    yield chunk([entry(delta, piece, reason)])
                    continue
                piece, made = calls[delta.index].push(piece, ended=reason is not None)
                if reason is not None and calls[delta.index].made:
                    reason = "tool_calls"
                choice = entry(delta, piece, reason)
                if made:
                    choice["delta"]["tool_calls"] = made
                yield chunk([choice])
            if all(ended):
                break
            batch = await anext(rest, None)
    finally:
        await rest.aclose()  # every choice ended, or the client left: the request leaves the engine
    if body.stream_options is not None and body.stream_options.include_usage:
        yield chunk([], usage=usage(prompt_tokens, generated))
