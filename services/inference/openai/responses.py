"""The bodies of OpenAI's answers (whole, not streamed: `streaming` sends chunks):
choices, their logprobs and usage.

Logprobs (`logprobs` of a completion, `logprobs` / `top_logprobs` of a chat) are under the
distribution sampled from, softmax(logits' / T) with logits' the logits as the request's
logits processors left them (without any, the distribution the trainer recomputes); at most
MAX_TOP_LOGPROBS alternatives per position.

`echo` repeats each prompt before its completion, with the prompt tokens' logprobs under the
model's own distribution (temperature 1; the first token has none), as OpenAI and vLLM do.
With `best_of` > n, the n samples with the highest logprob per token are answered, best
first. Chat tool calls come back as `tool_calls` (`tool_calls`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.inference import Completion, FinishReason, TopLogprobs
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest
from rlrun.inference.openai.request_params import stop_strings
from rlrun.inference.openai.text import visible_text
from rlrun.inference.openai.tool_calls import forced_tool_calls, split_tool_calls
from rlrun.inference.openai.tool_parsers import ToolCallParser

ChoiceFinishReason = Literal[FinishReason, "tool_calls"]
"""A choice's `finish_reason` as OpenAI reports it: the engine's, or "tool_calls" for a chat
choice that made tool calls."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def _token_text(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


LOWEST_LOGPROB = -9999.0
"""What an alternative that min_p/top_k/top_p truncated away reports: its logprob is -inf,
which JSON cannot carry (vLLM reports the same)."""


def _json_logprob(value: float) -> float:
    return max(value, LOWEST_LOGPROB)


@dataclass
class Echo:
    """A prompt repeated before its completion (`echo`): its tokens, each one's logprob (None
    for the first, which has no context) and with top_logprobs, each position's most likely
    tokens (None for the first)."""

    token_ids: list[int]
    logprobs: list[float | None]
    top: list[TopLogprobs | None] | None


def completion_logprobs(
    tokenizer: Tokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top: Sequence[TopLogprobs | None] | None,
    text_offset: int = 0,
) -> dict:
    """A completion choice's `logprobs`: each token's text and logprob, and with `top`, a
    {text: logprob} map of each position's most likely tokens (None where a position has no
    logprob: an echoed prompt's first token). `text_offset`: the characters of the choice
    before these tokens (a stream's earlier chunks)."""
    tokens = [_token_text(tokenizer, t) for t in token_ids]
    top_maps = None
    if top is not None:
        top_maps = [
            None
            if position is None
            else {_token_text(tokenizer, t): _json_logprob(value) for t, value in position}
            for position in top
        ]
    return {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": top_maps,
        "text_offset": _offsets(tokens, text_offset),
    }


def _chat_entry(tokenizer: Tokenizer, token: int, logprob: float) -> dict:
    text = _token_text(tokenizer, token)
    return {"token": text, "logprob": _json_logprob(logprob), "bytes": list(text.encode())}


def chat_logprobs(
    tokenizer: Tokenizer,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[TopLogprobs] | None,
) -> dict:
    """A chat choice's `logprobs`: an entry per token, with its position's most likely tokens."""
    tops = top if top is not None else [[] for _ in token_ids]
    content = [
        {
            **_chat_entry(tokenizer, token, logprob),
            "top_logprobs": [_chat_entry(tokenizer, *t) for t in position],
        }
        for token, logprob, position in zip(token_ids, logprobs, tops, strict=True)
    ]
    return {"content": content}


def best_of_each(completions: Sequence[Completion], n: int) -> list[Completion]:
    """The `n` completions of one prompt with the highest logprob per token (OpenAI's `best_of`),
    best first; all of them, in order, when there are `n`."""
    if len(completions) == n:
        return list(completions)
    ranked = sorted(completions, key=lambda c: sum(c.logprobs) / max(1, len(c.logprobs)), reverse=True)
    return ranked[:n]


def usage(prompt_tokens: int, generated: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
    }


def completion_body(
    request: CompletionRequest,
    tokenizer: Tokenizer,
    model_id: str,
    prompt_tokens: int,
    completions: Sequence[Completion],
    echoes: Sequence[Echo] | None = None,
) -> dict:
    """`echoes`: with `echo`, the prompt of each choice."""
    stops = stop_strings(request)
    choices = []
    for index, completion in enumerate(completions):
        token_ids: Sequence[int] = completion.token_ids
        logprobs: Sequence[float | None] = completion.logprobs
        top: Sequence[TopLogprobs | None] | None = completion.top_logprobs
        if echoes is not None:
            echo = echoes[index]
            token_ids = [*echo.token_ids, *token_ids]
            logprobs = [*echo.logprobs, *logprobs]
            if top is not None and echo.top is not None:
                top = [*echo.top, *top]
        text, stopped = visible_text(tokenizer, completion.token_ids, stops, request.min_tokens)
        if echoes is not None:
            text = tokenizer.decode(echoes[index].token_ids) + text
        choices.append(
            {
                "index": index,
                "text": text,
                "logprobs": None
                if request.logprobs is None
                else completion_logprobs(tokenizer, token_ids, logprobs, top),
                "finish_reason": "stop" if stopped else completion.finish_reason,
            }
        )
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model_id,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in completions)),
    }


def chat_body(
    request: ChatCompletionRequest,
    tokenizer: Tokenizer,
    model_id: str,
    prompt_tokens: int,
    completions: Sequence[Completion],
    parser: type[ToolCallParser],
) -> dict:
    """`parser`: the format the answers' tool calls are read in."""
    stops = stop_strings(request)
    mode = request.tool_mode()
    choices = []
    for index, completion in enumerate(completions):
        logprobs = None
        if request.logprobs:
            logprobs = chat_logprobs(
                tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs
            )
        text, stopped = visible_text(tokenizer, completion.token_ids, stops, request.min_tokens)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason: ChoiceFinishReason = "stop" if stopped else completion.finish_reason
        if mode != "none":
            if mode == "auto":
                content, calls = split_tool_calls(
                    text, parser, request.offered_tools(), request.tool_call_limit()
                )
            else:
                content, calls = forced_tool_calls(text, request.forced_name())
            if calls:
                message = {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [c.to_openai() for c in calls],
                }
                reason = "tool_calls"
        choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason})
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model_id,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in completions)),
    }


def _offsets(tokens: Sequence[str], position: int) -> list[int]:
    offsets = []
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return offsets
