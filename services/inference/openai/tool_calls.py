"""Reading tool calls out of an answer, in the format of the run's tool-call parser
(`rlrun.inference.openai.tool_parsers`, `inference.tool_call_parser`): the text outside the
calls is the message's content. Pure: no engine, no HTTP. The whole answer and the stream
split a text the same way (the whole answer is one push to the parser's stream).

A constrained answer (`tool_choice` "required" or named) is JSON whatever the format
(`forced_tool_calls`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlrun.inference.openai.tool_parsers.base import (
    Members,
    NotJson,
    Settled,
    ToolCall,
    ToolCallParser,
    items,
    new_call_id,
    value,
    whole,
)


def forced_tool_calls(text: str, name: str | None) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer constrained to tool calls (`tool_choice` "required" or
    named): with `name`, the text is that function's arguments object; without, an array of
    {"name", "parameters"} objects. Text that is no such JSON (cut short by max_tokens) stays
    the content, with no calls."""
    try:
        found: list[Members] = (
            [{"name": (name, ""), "parameters": whole(text, _written)}]
            if name is not None
            else whole(text, items)
        )
    except NotJson:
        return text, []
    calls = []
    for item in found:
        called = item.get("name", (None, ""))[0]
        parameters, written = item.get("parameters", (None, ""))
        if not (isinstance(called, str) and isinstance(parameters, dict)):
            return text, []
        calls.append(ToolCall(called, written, new_call_id()))
    return None, calls


def _written(text: str, at: int) -> tuple[tuple[Any, str], int]:
    parsed, start, end = value(text, at)
    return (parsed, text[start:end]), end


class LimitedCalls:
    """A parser's stream that passes on at most `limit` calls (`parallel_tool_calls: false`
    keeps the first); later ones are read, and dropped."""

    def __init__(self, parser: type[ToolCallParser], tools: Sequence[dict], limit: int | None):
        self.parser = parser(tools)
        self.limit = limit
        self.passed = 0

    def _kept(self, settled: Settled) -> Settled:
        kept: Settled = []
        for item in settled:
            if isinstance(item, ToolCall):
                self.passed += 1
                if self.limit is not None and self.passed > self.limit:
                    continue
            kept.append(item)
        return kept

    def push(self, text: str, ended: bool = False) -> Settled:
        return self._kept(self.parser.push(text) + (self.parser.finish() if ended else []))


def split_tool_calls(
    text: str, parser: type[ToolCallParser], tools: Sequence[dict] = (), limit: int | None = None
) -> tuple[str | None, list[ToolCall]]:
    """A whole answer's content (None when only calls were written) and its calls."""
    settled = LimitedCalls(parser, tools, limit).push(text, ended=True)
    calls = [item for item in settled if isinstance(item, ToolCall)]
    content = "".join(item for item in settled if isinstance(item, str))
    if calls and not content.strip():
        return None, calls
    return content, calls


class StreamedCalls:
    """One chat choice's text as it streams, split into content and tool calls."""

    def __init__(self, parser: type[ToolCallParser], tools: Sequence[dict], limit: int | None):
        self.stream = LimitedCalls(parser, tools, limit)
        self.made = 0

    def push(self, text: str, ended: bool) -> tuple[str, list[dict]]:
        """The content settled by `text` (all of it once `ended`) and the calls it completed,
        as a delta's `tool_calls`."""
        settled = self.stream.push(text, ended)
        calls = [item for item in settled if isinstance(item, ToolCall)]
        made = [call.to_openai(index=self.made + k) for k, call in enumerate(calls)]
        self.made += len(made)
        return "".join(item for item in settled if isinstance(item, str)), made


class ForcedCalls:
    """One chat choice's text as it streams, constrained to tool calls: held back until it
    ends, then sent as calls (`forced_tool_calls`)."""

    def __init__(self, name: str | None):
        self.name = name
        self.text = ""
        self.made = 0

    def push(self, text: str, ended: bool) -> tuple[str, list[dict]]:
        self.text += text
        if not ended:
            return "", []
        content, calls = forced_tool_calls(self.text, self.name)
        self.made = len(calls)
        return content or "", [call.to_openai(index=k) for k, call in enumerate(calls)]
