"""The model may call tools; their results arrive as tool messages."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable

from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.errors import ToolError
from rlrun.env_server.sdk.harness import Harness

Tool = Callable[[str], "str | Awaitable[str]"]
"""Takes the text between the parentheses of a call; returns the result shown to the model."""

TOOL_CALL = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\((?P<args>.*)\)\s*$", re.DOTALL)
"""An assistant message that is exactly `name(args)` is a tool call; anything else is the answer."""


def parse_tool_call(text: str) -> tuple[str, str] | None:
    match = TOOL_CALL.match(text)
    return (match["name"], match["args"]) if match else None


class ToolCallingHarness(Harness):
    """Alternates assistant turns and tool results until the model answers without calling a
    tool (completed) or has used up `max_tool_calls` (max_turns). A ToolError, or a call to an
    unknown tool, becomes an `error: ...` tool result the model can react to."""

    def __init__(self, tools: dict[str, Tool], max_tool_calls: int = 2):
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.tools = tools
        self.max_tool_calls = max_tool_calls

    async def call(self, name: str, args: str) -> str:
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name}"
        try:
            result = tool(args)
            return await result if inspect.isawaitable(result) else result
        except ToolError as error:
            return f"error: {error}"

    async def run(self, episode: Episode) -> None:
        episode.metrics["tool_calls"] = 0
        while True:
            completion = await episode.generate()
            if completion.finish_reason == "length":
                return episode.finish("length")
            call = parse_tool_call(episode.answer)
            if call is None:
                return episode.finish("completed")
            if episode.metrics["tool_calls"] == self.max_tool_calls:
                return episode.finish("max_turns")
            episode.metrics["tool_calls"] += 1
            episode.conversation.add_observation("tool", await self.call(*call))
