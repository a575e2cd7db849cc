"""Mistral (`mistral`): the content, then `[TOOL_CALLS]` and the calls (vLLM's `mistral`
parser), written one of two ways by the tokenizer's version:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]     (v3 to v7)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                           (v11 and later)

the second repeated (`[TOOL_CALLS]` before each) for several calls.
"""

from __future__ import annotations

import re

from rlrun.inference.openai.tool_parsers.base import (
    NotJson,
    TailParser,
    ToolCall,
    items,
    json_call,
    members,
    new_call_id,
    partial_length,
    whole,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class MistralParser(TailParser):
    name = "mistral"
    template_markers = (TOOL_CALLS,)

    def start(self, text: str) -> tuple[int | None, int]:
        at = text.find(TOOL_CALLS)
        return (at, 0) if at >= 0 else (None, partial_length(text, TOOL_CALLS))

    def tail(self, text: str) -> list[ToolCall] | None:
        body = text.removeprefix(TOOL_CALLS).strip()
        try:
            if body.startswith("["):
                calls = [json_call(obj, ("arguments",)) for obj in whole(body, items)]
            else:
                calls = [self._named(part) for part in body.split(TOOL_CALLS)]
        except NotJson:
            return None
        return None if not calls or any(c is None for c in calls) else [c for c in calls if c is not None]

    def _named(self, part: str) -> ToolCall | None:
        name, sep, arguments = part.partition(ARGS)
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            return None
        obj_text = arguments.strip()
        whole(obj_text, members)  # strict JSON object, or NotJson
        return ToolCall(name, obj_text, new_call_id())
