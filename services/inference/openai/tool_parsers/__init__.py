"""The tool-call formats an answer may write, one module per format, in one `Registry`
(`inference.tool_call_parser` names one; an installed parser registers under the entry point
group `rlrun.tool_parsers`, a `ToolCallParser` subclass).

`auto` (the default) reads the tokenizer's chat template: the parser whose `template_markers`
all appear in it, the most of them winning (Qwen3-Coder's template holds Hermes's `<tool_call>`
too). A tokenizer without a chat template, or one whose template teaches none of them, is
offered tools by rlrun's own prompt, which teaches Hermes (`rlrun.common.hermes`).
"""

from __future__ import annotations

from rlrun.common.registry import Registry
from rlrun.inference.openai.tool_parsers.base import ToolCall, ToolCallParser
from rlrun.inference.openai.tool_parsers.hermes import HermesParser
from rlrun.inference.openai.tool_parsers.llama3_json import Llama3JsonParser
from rlrun.inference.openai.tool_parsers.mistral import MistralParser
from rlrun.inference.openai.tool_parsers.qwen3_coder import Qwen3CoderParser

AUTO = "auto"

PARSERS: Registry[type[ToolCallParser]] = Registry(
    "tool-call parser", "rlrun.tool_parsers", base=ToolCallParser
)
for _parser in (HermesParser, Qwen3CoderParser, Llama3JsonParser, MistralParser):
    PARSERS.register(_parser)


def choose_parser(name: str, chat_template: str | None) -> type[ToolCallParser]:
    """The parser `name` names, or for `auto` the one `chat_template` teaches; ValueError
    naming the nearest parser for an unknown name."""
    if name != AUTO:
        return PARSERS.resolve(name)
    matching = [
        PARSERS[key]
        for key in PARSERS
        if chat_template and all(marker in chat_template for marker in PARSERS[key].template_markers)
    ]
    if not matching:
        return HermesParser
    return max(matching, key=lambda parser: len(parser.template_markers))


__all__ = ["AUTO", "PARSERS", "ToolCall", "ToolCallParser", "choose_parser"]
