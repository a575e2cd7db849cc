"""The Hermes tool-call format, the one Qwen2.5/Qwen3 and Hermes models are trained on and
vLLM's `hermes` parser reads. A model offered tools writes each call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Here: how a conversation shows tools and earlier calls to a model whose tokenizer has no chat
template of its own (the char tokenizer). Reading calls out of answers is the inference
service's (`rlrun.inference.openai.tool_calls`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def calls_text(calls: Sequence[dict]) -> str:
    """An assistant message's `tool_calls` (OpenAI's shape) as the text the model writes."""
    blocks = []
    for call in calls:
        function = call["function"]
        arguments = function.get("arguments") or "{}"
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        body = json.dumps({"name": function["name"], "arguments": parsed}, ensure_ascii=False)
        blocks.append(f"{OPEN}\n{body}\n{CLOSE}")
    return "\n".join(blocks)


def tools_prompt(tools: Sequence[dict]) -> str:
    """The tools as a system prompt (the words of Qwen's template, which models trained on
    this format have seen)."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN}{CLOSE} XML tags:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    )
