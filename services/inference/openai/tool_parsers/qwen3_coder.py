"""Qwen3-Coder XML (`qwen3_coder`): each call a `<tool_call>` block holding a `<function=NAME>`
element and one `<parameter=KEY>` element per argument, its value as plain text (vLLM's
`qwen3_coder` parser):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value is text; the tool's JSON schema says what it becomes: a parameter declared `string`
(or not declared) stays the text, any other type is read as JSON (`5` -> 5, `true` -> true,
`{"a": 1}` -> an object), and text that is no JSON value stays a string. The line break after
the opening tag and before the closing one belongs to the format, not the value.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlrun.common.hermes import CLOSE, OPEN
from rlrun.inference.openai.tool_parsers.base import BlockParser, NotJson, ToolCall, new_call_id, strict_json

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderParser(BlockParser):
    name = "qwen3_coder"
    template_markers = (OPEN, "<function=", "<parameter=")
    OPEN = OPEN
    CLOSE = CLOSE

    def block(self, body: str) -> ToolCall | None:
        function = _FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inner = function.group(1).strip(), function.group(2)
        if _PARAMETER.sub("", inner).strip():  # text that is no parameter: not this format
            return None
        arguments = {
            key.strip(): self._typed(name, key.strip(), text) for key, text in _PARAMETER.findall(inner)
        }
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False), new_call_id())

    def _typed(self, function: str, key: str, text: str) -> Any:
        text = text.removeprefix("\n").removesuffix("\n")
        schema = self.tools.get(function, {}).get("parameters") or {}
        declared = (schema.get("properties") or {}).get(key, {}).get("type", "string")
        if declared == "string" or (isinstance(declared, list) and "string" in declared):
            return text
        try:
            return strict_json(text.strip())
        except NotJson:
            return text
