"""Reading tool calls out of an answer, in the Hermes format (`rlrun.common.hermes`): the text
outside the call blocks is the message's content. Pure: no engine, no HTTP.

A block whose body is not a JSON object with a string `name` and an object `arguments` (or
that the sample never closes) is not a call: its text stays in the content, so nothing the
model wrote is lost. The whole answer and the stream split a text the same way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from rlrun.common.hermes import CLOSE, OPEN


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments object as JSON text, as OpenAI's API carries it."""
    id: str

    def to_openai(self, index: int | None = None) -> dict:
        entry = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return entry if index is None else {"index": index, **entry}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(body: str) -> ToolCall | None:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(parsed["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())


def forced_tool_calls(text: str, name: str | None) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer constrained to tool calls (`tool_choice` "required" or
    named): with `name`, the text is that function's arguments object; without, an array of
    {"name", "parameters"} objects. Text that is no such JSON (cut short by max_tokens) stays
    the content, with no calls."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if name is not None:
        items = [{"name": name, "parameters": parsed}]
    elif isinstance(parsed, list):
        items = parsed
    else:
        return text, []
    calls = []
    for item in items:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("parameters"), dict)
        ):
            return text, []
        calls.append(
            ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False), new_call_id())
        )
    return None, calls


class ToolCallStream:
    """Splits a sample's text, as it grows, into content and tool calls. `push` takes the
    next piece of text and returns what it settles, in order: content text (str) and calls
    (ToolCall). Held back until more text settles it: a tail that may begin a block, an open
    block, and trailing whitespace (dropped where a call or, after calls, the end follows:
    the format's line breaks, not the answer). However the text is cut into pieces, the
    same content and calls come out."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        """The most calls passed on (`parallel_tool_calls: false` keeps the first); later ones
        are read, and dropped."""
        self._pending = ""
        """Text not yet read: an open block, or a tail that may begin one."""
        self._space = ""
        """Trailing whitespace of the content so far."""
        self.calls = 0

    def push(self, text: str) -> list[str | ToolCall]:
        self._pending += text
        settled: list[str | ToolCall] = []
        while True:
            start = self._pending.find(OPEN)
            if start < 0:
                cut = len(self._pending) - _partial_open_length(self._pending)
                self._content(settled, self._pending[:cut])
                self._pending = self._pending[cut:]
                return settled
            end = self._pending.find(CLOSE, start + len(OPEN))
            self._content(settled, self._pending[:start])
            if end < 0:
                self._pending = self._pending[start:]
                return settled
            block = self._pending[start : end + len(CLOSE)]
            self._pending = self._pending[end + len(CLOSE) :]
            call = _call(block[len(OPEN) : -len(CLOSE)])
            if call is None:
                self._content(settled, block)
            else:
                self._space = ""
                self.calls += 1
                if self.limit is None or self.calls <= self.limit:
                    settled.append(call)

    def finish(self) -> list[str | ToolCall]:
        """What was held back, once the sample has ended (a block never closed is content)."""
        settled: list[str | ToolCall] = []
        self._content(settled, self._pending)
        self._pending = ""
        if self._space and not self.calls:
            settled.append(self._space)
        self._space = ""
        return settled

    def _content(self, settled: list[str | ToolCall], text: str) -> None:
        combined = self._space + text
        kept = combined.rstrip()
        self._space = combined[len(kept) :]
        if kept:
            settled.append(kept)


def _partial_open_length(text: str) -> int:
    """How many trailing characters of `text` could begin OPEN."""
    for length in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-length:]):
            return length
    return 0


def split_tool_calls(text: str, limit: int | None = None) -> tuple[str | None, list[ToolCall]]:
    """A whole answer's content (None when only calls were written) and its calls."""
    stream = ToolCallStream(limit)
    items = stream.push(text) + stream.finish()
    calls = [item for item in items if isinstance(item, ToolCall)]
    content = "".join(item for item in items if isinstance(item, str))
    if calls and not content.strip():
        return None, calls
    return content, calls
