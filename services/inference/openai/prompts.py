"""The prompts of an OpenAI request as token ids: a completion's as given or encoded, a
chat's rendered by the tokenizer's chat template with the request's tools (earlier tool calls
written as the model writes them: Hermes)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rlrun.common.errors import RequestError
from rlrun.common.hermes import calls_text
from rlrun.common.tokenizer import ChatMessage, Tokenizer, render_chat
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest, ContentPart

if TYPE_CHECKING:  # annotations only: Python 3.13's typing.TypeIs
    from typing_extensions import TypeIs

Prompts = list[tuple[str, list[int]]]
"""The prompts of one request, each with the name of its field (for the 400 that names it)."""


PromptBuilder = Callable[..., Prompts]
"""(request, tokenizer, limits) -> its prompts: `completion_prompts` or `chat_prompts`; a
request beyond the limits is refused before any text is encoded."""


def completion_prompts(request: CompletionRequest, tokenizer: Tokenizer, limits: RequestLimits) -> Prompts:
    prompt = request.prompt
    if isinstance(prompt, str):
        limits.check("prompt", len(prompt), "max_text_chars", "characters")
        return [("prompt", tokenizer.encode(prompt))]
    if _batch(prompt):
        batch: Sequence[str | list[int]] = prompt  # enumerate would join the two list types
        limits.check(
            "prompt",
            len(batch) * request.samples_per_prompt(),
            "max_samples",
            f"samples ({len(batch)} prompts x {request.samples_field()} = {request.samples_per_prompt()})",
        )
        for i, item in enumerate(batch):
            if isinstance(item, str):
                limits.check(f"prompt[{i}]", len(item), "max_text_chars", "characters")
        return [
            (f"prompt[{i}]", tokenizer.encode(item) if isinstance(item, str) else list(item))
            for i, item in enumerate(batch)
        ]
    return [("prompt", list(prompt))]


def _batch(prompt: list[int] | list[str] | list[list[int]]) -> TypeIs[list[str] | list[list[int]]]:
    """A batch of prompts, not one prompt of token ids: the request model admits only lists of
    one kind, so the first item tells (an empty list is an empty prompt)."""
    return bool(prompt) and not isinstance(prompt[0], int)


def chat_prompts(request: ChatCompletionRequest, tokenizer: Tokenizer, limits: RequestLimits) -> Prompts:
    """The conversation rendered by the tokenizer's chat template, with the request's tools:
    always one prompt. Earlier tool calls are written as the model writes them (Hermes)."""
    request.tool_mode()  # refuses a tool_choice it cannot keep before anything runs
    limits.check("messages", len(request.messages), "max_messages", "messages")
    messages = []
    for i, message in enumerate(request.messages):
        if message.function_call:
            raise RequestError(
                f"messages[{i}].function_call",
                "function_call is not supported by this server; use tool_calls",
            )
        content = message.content or ""
        if not isinstance(content, str):
            content = "".join(
                _text_part(part, f"messages[{i}].content[{j}]") for j, part in enumerate(content)
            )
        if message.tool_calls:
            if message.role != "assistant":
                raise RequestError(f"messages[{i}].tool_calls", "only assistant messages carry tool_calls")
            calls = calls_text([call.model_dump() for call in message.tool_calls])
            content = f"{content}\n{calls}" if content else calls
        limits.check(f"messages[{i}].content", len(content), "max_text_chars", "characters")
        messages.append(ChatMessage("system" if message.role == "developer" else message.role, content))
    tools = [tool.model_dump() for tool in request.tools or ()]
    if tools:
        limits.check("tools", len(json.dumps(tools)), "max_text_chars", "characters (as JSON)")
    try:
        return [("messages", render_chat(tokenizer, messages, add_generation_prompt=True, tools=tools))]
    except ValueError as error:
        raise RequestError("messages", str(error)) from error


def _text_part(part: ContentPart, where: str) -> str:
    if part.type != "text":
        raise RequestError(f"{where}.type", f"only text content parts are supported, got {part.type!r}")
    if part.text is None:
        raise RequestError(f"{where}.text", "a text content part needs its text")
    return part.text
