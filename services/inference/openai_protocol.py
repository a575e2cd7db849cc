"""OpenAI-compatible request models and response bodies (pure: no FastAPI, no engine).

A completion's `prompt` is a string, a list of token ids, or a batch of either; choice
`i * n + j` of the answer is sample j of prompt i, as in OpenAI's API.

Differences from OpenAI, each answered with a 400 naming the field rather than ignored:
`stop` strings must each be one token of the tokenizer (generation stops on token ids);
`echo`, `best_of` > n and `top_logprobs` / `logprobs` above 0 are not offered, since the engine
reports the logprob of the sampled token only. `top_k` and `stop_token_ids` are accepted as
vLLM-style extensions. The `model` field is accepted and ignored: one model is served.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import ChatMessage, Tokenizer, render_chat
from rlrun.common.types import SamplingParams
from rlrun.inference.engines.base import Completion


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = []
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_shape(cls, value, parse):
        # One message for every wrong shape, instead of one per member of the union.
        try:
            return parse(value)
        except ValidationError as error:
            raise PydanticCustomError(
                "prompt_shape",
                "prompt must be a string, a list of token ids, or a batch: a list of strings "
                "or a list of token id lists",
            ) from error


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)


def _stop_token_ids(request: _SamplingFields, tokenizer: Tokenizer) -> list[int]:
    stops = list(tokenizer.stop_token_ids) + list(request.stop_token_ids)
    strings = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    for i, text in enumerate(strings):
        ids = tokenizer.encode(text)
        if len(ids) != 1:
            raise RequestError(
                f"stop[{i}]",
                f"stop[{i}] = {text!r} is {len(ids)} tokens; only single-token stops are supported",
            )
        stops.append(ids[0])
    return sorted(set(stops))


def sampling_params(
    request: _SamplingFields,
    tokenizer: Tokenizer,
    prompt_len: int,
    max_model_len: int,
    max_tokens: int | None,
) -> SamplingParams:
    """The engine's settings for a request; `max_tokens` None means the rest of the context."""
    if request.top_k < 0:
        raise RequestError("top_k", f"top_k must be >= 0, got {request.top_k}")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else max_model_len - prompt_len,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop_token_ids=_stop_token_ids(request, tokenizer),
        seed=request.seed,
        n=request.n,
    )


Prompts = list[tuple[str, list[int]]]
"""The prompts of one request, each with the name of its field (for the 400 that names it)."""


def completion_prompts(request: CompletionRequest, tokenizer: Tokenizer) -> Prompts:
    if request.echo:
        raise RequestError("echo", "echo is not supported")
    if request.logprobs:
        raise RequestError("logprobs", "only logprobs = 0 (the sampled token's logprob) is supported")
    prompt = request.prompt
    if isinstance(prompt, str):
        return [("prompt", tokenizer.encode(prompt))]
    if not prompt or isinstance(prompt[0], int):
        return [("prompt", list(prompt))]
    return [
        (f"prompt[{i}]", tokenizer.encode(item) if isinstance(item, str) else list(item))
        for i, item in enumerate(prompt)
    ]


def chat_prompts(request: ChatCompletionRequest, tokenizer: Tokenizer) -> Prompts:
    """The conversation rendered by the tokenizer's chat template: always one prompt."""
    if request.top_logprobs:
        raise RequestError("top_logprobs", "only top_logprobs = 0 (the sampled token's logprob) is supported")
    messages = []
    for message in request.messages:
        content = message.content or ""
        if not isinstance(content, str):
            content = "".join(part.text for part in content)
        messages.append(ChatMessage("system" if message.role == "developer" else message.role, content))
    try:
        return [("messages", render_chat(tokenizer, messages, add_generation_prompt=True))]
    except ValueError as error:
        raise RequestError("messages", str(error)) from error


class TextStream:
    """Incremental detokenization of one sample: the text each new batch of tokens adds.
    Holds back a trailing U+FFFD, the mark of a multi-byte character not yet complete."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.emitted = ""

    def push(self, token_ids: Sequence[int]) -> str:
        self.token_ids += token_ids
        text = self.tokenizer.decode(self.token_ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self.emitted) :]
        self.emitted = text
        return piece


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def token_logprobs(tokenizer: Tokenizer, token_ids: Sequence[int], logprobs: Sequence[float]) -> list[dict]:
    """Chat `logprobs.content` entries."""
    entries = []
    for token, logprob in zip(token_ids, logprobs, strict=True):
        text = tokenizer.decode([token], skip_special_tokens=False)
        entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return entries


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
) -> dict:
    choices = []
    for index, completion in enumerate(completions):
        logprobs = None
        if request.logprobs is not None:
            tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in completion.token_ids]
            logprobs = {
                "tokens": tokens,
                "token_logprobs": completion.logprobs,
                "top_logprobs": None,
                "text_offset": _offsets(tokens),
            }
        choices.append(
            {
                "index": index,
                "text": tokenizer.decode(completion.token_ids),
                "logprobs": logprobs,
                "finish_reason": completion.finish_reason,
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
) -> dict:
    choices = []
    for index, completion in enumerate(completions):
        logprobs = None
        if request.logprobs:
            logprobs = {"content": token_logprobs(tokenizer, completion.token_ids, completion.logprobs)}
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": tokenizer.decode(completion.token_ids)},
                "logprobs": logprobs,
                "finish_reason": completion.finish_reason,
            }
        )
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model_id,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in completions)),
    }


def _offsets(tokens: Sequence[str]) -> list[int]:
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return offsets


def error_body(
    message: str, param: str | None, error_type: str = "invalid_request_error", code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
