"""Reading tool calls out of an answer, in the Hermes format (`rlrun.common.hermes`): the text
outside the call blocks is the message's content. Pure: no engine, no HTTP.

A block whose body is not a JSON object with a string `name` and an object `arguments` (or
that the sample never closes) is not a call: its text stays in the content, so nothing the
model wrote is lost. The whole answer and the stream split a text the same way.

A call's `arguments` is always valid JSON: the model's own text of the arguments object,
kept as written when it parses as strict JSON. A value JSON cannot hold is refused, not
re-written: `NaN`/`Infinity` literals, and numbers too large for a double (`1e999`, which
Python reads as inf and would dump as `Infinity`); such a block is no call (its text stays
the content), as is the text of a constrained answer (`forced_tool_calls`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlrun.common.hermes import CLOSE, OPEN

T = TypeVar("T")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments object as JSON text, as OpenAI's API carries it."""
    id: str

    def to_openai(self, index: int | None = None) -> dict:
        entry: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return entry if index is None else {"index": index, **entry}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class NotJson(ValueError):
    """Text that is not strict JSON (RFC 8259): malformed, or holding a value JSON cannot."""


def _refuse_constant(name: str) -> Any:
    raise NotJson(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"{text} does not fit a double")
    return value


_STRICT = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_SPACE = " \t\n\r"


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _expect(text: str, at: int, char: str) -> int:
    at = _skip(text, at)
    if text[at : at + 1] != char:
        raise NotJson(f"expected {char!r} at {at}")
    return at + 1


def _value(text: str, at: int) -> tuple[Any, int, int]:
    """The strict JSON value at `at` (after whitespace), where its text starts and ends."""
    start = _skip(text, at)
    try:
        value, end = _STRICT.raw_decode(text, start)
    except json.JSONDecodeError as error:
        raise NotJson(str(error)) from None
    return value, start, end


def _members(text: str, at: int) -> tuple[dict[str, tuple[Any, str]], int]:
    """The JSON object at `at`: each member's value and its own text; and where it ends."""
    at = _expect(text, at, "{")
    members: dict[str, tuple[Any, str]] = {}
    if text[_skip(text, at) : _skip(text, at) + 1] == "}":
        return members, _skip(text, at) + 1
    while True:
        key, _, at = _value(text, at)
        if not isinstance(key, str):
            raise NotJson("an object's keys are strings")
        at = _expect(text, at, ":")
        value, start, at = _value(text, at)
        members[key] = (value, text[start:at])
        at = _skip(text, at)
        if text[at : at + 1] == "}":
            return members, at + 1
        at = _expect(text, at, ",")


def _whole(text: str, parse: Callable[[str, int], tuple[T, int]]) -> T:
    """`parse` over the whole text (surrounding whitespace allowed)."""
    value, end = parse(text, 0)
    if _skip(text, end) != len(text):
        raise NotJson("text after the JSON value")
    return value


def strict_json(text: str) -> Any:
    """`text` as a strict JSON value (NotJson when it is none)."""
    return _whole(text, lambda t, at: _value(t, at)[::2])


def _call(body: str) -> ToolCall | None:
    try:
        members = _whole(body, _members)
    except NotJson:
        return None
    name = members.get("name", (None, ""))[0]
    arguments, written = members.get("arguments", ({}, "{}"))
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return ToolCall(name, written, new_call_id())


def forced_tool_calls(text: str, name: str | None) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer constrained to tool calls (`tool_choice` "required" or
    named): with `name`, the text is that function's arguments object; without, an array of
    {"name", "parameters"} objects. Text that is no such JSON (cut short by max_tokens) stays
    the content, with no calls."""
    try:
        items = (
            [{"name": (name, ""), "parameters": _whole(text, _written)}]
            if name is not None
            else _whole(text, _items)
        )
    except NotJson:
        return text, []
    calls = []
    for item in items:
        called = item.get("name", (None, ""))[0]
        parameters, written = item.get("parameters", (None, ""))
        if not (isinstance(called, str) and isinstance(parameters, dict)):
            return text, []
        calls.append(ToolCall(called, written, new_call_id()))
    return None, calls


def _written(text: str, at: int) -> tuple[tuple[Any, str], int]:
    value, start, end = _value(text, at)
    return (value, text[start:end]), end


def _items(text: str, at: int) -> tuple[list[dict[str, tuple[Any, str]]], int]:
    """A JSON array of objects, each member with its own text."""
    at = _expect(text, at, "[")
    items: list[dict[str, tuple[Any, str]]] = []
    if text[_skip(text, at) : _skip(text, at) + 1] == "]":
        return items, _skip(text, at) + 1
    while True:
        members, at = _members(text, at)
        items.append(members)
        at = _skip(text, at)
        if text[at : at + 1] == "]":
            return items, at + 1
        at = _expect(text, at, ",")


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


class StreamedCalls:
    """One chat choice's text as it streams, split into content and tool calls."""

    def __init__(self, limit: int | None):
        self.stream = ToolCallStream(limit)
        self.made = 0

    def push(self, text: str, ended: bool) -> tuple[str, list[dict]]:
        """The content settled by `text` (all of it once `ended`) and the calls it completed,
        as a delta's `tool_calls`."""
        items = self.stream.push(text) + (self.stream.finish() if ended else [])
        calls = [item for item in items if isinstance(item, ToolCall)]
        made = [call.to_openai(index=self.made + k) for k, call in enumerate(calls)]
        self.made += len(made)
        return "".join(item for item in items if isinstance(item, str)), made


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
