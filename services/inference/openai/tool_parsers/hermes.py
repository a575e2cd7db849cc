"""Hermes (`hermes`): each call a JSON object in a `<tool_call>` block, the format Hermes and
Qwen2.5/Qwen3 models are trained on (vLLM's `hermes` parser), and the one rlrun's own tools
prompt teaches a tokenizer without a chat template (`rlrun.common.hermes`):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

from rlrun.common.hermes import CLOSE, OPEN
from rlrun.inference.openai.tool_parsers.base import BlockParser, NotJson, ToolCall, json_call, members, whole


class HermesParser(BlockParser):
    name = "hermes"
    template_markers = (OPEN,)
    OPEN = OPEN
    CLOSE = CLOSE

    def block(self, body: str) -> ToolCall | None:
        try:
            return json_call(whole(body, members), ("arguments",))
        except NotJson:
            return None
