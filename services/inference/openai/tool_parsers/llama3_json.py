"""Llama 3 JSON (`llama3_json`): an answer that calls tools is nothing but the calls, each a
JSON object with `name` and `parameters`, `;`-separated, optionally after `<|python_tag|>`
(Llama 3.1-3.3's chat template; vLLM's `llama3_json` parser):

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

An answer that begins with anything else is content. `arguments` is read where `parameters`
is absent (some fine-tunes write it).
"""

from __future__ import annotations

from rlrun.inference.openai.tool_parsers.base import (
    SPACE,
    Members,
    NotJson,
    TailParser,
    ToolCall,
    expect,
    json_call,
    members,
    skip,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(TailParser):
    name = "llama3_json"
    template_markers = ("<|start_header_id|>ipython<|end_header_id|>",)

    def start(self, text: str) -> tuple[int | None, int]:
        at = len(text) - len(text.lstrip(SPACE))
        rest = text[at:]
        if rest.startswith((PYTHON_TAG, "{")):
            return at, 0
        if PYTHON_TAG.startswith(rest):  # empty, or a beginning of the tag
            return None, len(text)
        return None, 0

    def tail(self, text: str) -> list[ToolCall] | None:
        text = text.removeprefix(PYTHON_TAG)
        found: list[Members] = []
        try:
            at = 0
            while True:
                obj, at = members(text, at)
                found.append(obj)
                at = skip(text, at)
                if at == len(text):
                    break
                at = expect(text, at, ";")
        except NotJson:
            return None
        calls = [json_call(obj, ("parameters", "arguments")) for obj in found]
        return None if any(c is None for c in calls) else [c for c in calls if c is not None]
