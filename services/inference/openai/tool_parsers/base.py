"""What every tool-call format shares: the call as OpenAI carries it, strict JSON reading, and
the two shapes of splitting a growing answer into content and calls.

A parser is a stream: `push` takes the next piece of an answer's text and returns what it
settles, in order (content text and calls); `finish` what was held back once the answer has
ended. However the text is cut into pieces, the same content and calls come out, so a whole
answer is split by the same code (`rlrun.inference.openai.tool_calls.split_tool_calls`).

Text that does not parse as a call of the format stays content: nothing the model wrote is
lost. A call's `arguments` is always valid JSON: the model's own text of the arguments object
when the format writes JSON and it parses as strict JSON (a value JSON cannot hold, `NaN` or
`1e999`, makes it no call), or JSON written from the values the format carries.

The formats come in two shapes:
- `BlockParser`: calls are delimited blocks among the content (Hermes, Qwen3-Coder);
- `TailParser`: the calls take the rest of the answer from a start (Mistral's `[TOOL_CALLS]`,
  Llama 3's JSON answer).
"""

from __future__ import annotations

import abc
import json
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

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
SPACE = " \t\n\r"


def skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in SPACE:
        at += 1
    return at


def expect(text: str, at: int, char: str) -> int:
    at = skip(text, at)
    if text[at : at + 1] != char:
        raise NotJson(f"expected {char!r} at {at}")
    return at + 1


def value(text: str, at: int) -> tuple[Any, int, int]:
    """The strict JSON value at `at` (after whitespace), where its text starts and ends."""
    start = skip(text, at)
    try:
        parsed, end = _STRICT.raw_decode(text, start)
    except json.JSONDecodeError as error:
        raise NotJson(str(error)) from None
    return parsed, start, end


Members = dict[str, tuple[Any, str]]
"""A JSON object's members: each one's value and its own text."""


def members(text: str, at: int) -> tuple[Members, int]:
    """The JSON object at `at`, and where it ends."""
    at = expect(text, at, "{")
    found: Members = {}
    if text[skip(text, at) : skip(text, at) + 1] == "}":
        return found, skip(text, at) + 1
    while True:
        key, _, at = value(text, at)
        if not isinstance(key, str):
            raise NotJson("an object's keys are strings")
        at = expect(text, at, ":")
        parsed, start, at = value(text, at)
        found[key] = (parsed, text[start:at])
        at = skip(text, at)
        if text[at : at + 1] == "}":
            return found, at + 1
        at = expect(text, at, ",")


def items(text: str, at: int) -> tuple[list[Members], int]:
    """A JSON array of objects, and where it ends."""
    at = expect(text, at, "[")
    found: list[Members] = []
    if text[skip(text, at) : skip(text, at) + 1] == "]":
        return found, skip(text, at) + 1
    while True:
        obj, at = members(text, at)
        found.append(obj)
        at = skip(text, at)
        if text[at : at + 1] == "]":
            return found, at + 1
        at = expect(text, at, ",")


def whole(text: str, parse: Callable[[str, int], tuple[T, int]]) -> T:
    """`parse` over the whole text (surrounding whitespace allowed)."""
    parsed, end = parse(text, 0)
    if skip(text, end) != len(text):
        raise NotJson("text after the JSON value")
    return parsed


def strict_json(text: str) -> Any:
    """`text` as a strict JSON value (NotJson when it is none)."""
    return whole(text, lambda t, at: value(t, at)[::2])


def json_call(obj: Members, arguments_keys: Sequence[str]) -> ToolCall | None:
    """A call from a JSON object with a string `name` and an object under the first of
    `arguments_keys` it has (absent: no arguments); None when it is no such object."""
    name = obj.get("name", (None, ""))[0]
    key = next((k for k in arguments_keys if k in obj), None)
    arguments, written = obj[key] if key is not None else ({}, "{}")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return ToolCall(name, written, new_call_id())


def partial_length(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


Settled = list[str | ToolCall]


class ToolCallParser(abc.ABC):
    """One answer's text, as it grows, split into content and calls. Held back until more text
    settles it: whatever may still become a call, and trailing whitespace (dropped where a call
    or, after calls, the end follows: the format's line breaks, not the answer)."""

    name: ClassVar[str]
    """The `inference.tool_call_parser` value that picks it."""
    template_markers: ClassVar[tuple[str, ...]]
    """Text a chat template that teaches this format holds, all of it (`tool_call_parser =
    "auto"` picks the parser with the most markers, all found in the template)."""

    def __init__(self, tools: Sequence[dict] = ()) -> None:
        self.tools = {t["function"]["name"]: t["function"] for t in tools if "function" in t}
        """The tools offered, by name (OpenAI's `function` objects: a format that writes
        arguments as text reads their types from `parameters`)."""
        self.calls = 0
        self._space = ""

    @abc.abstractmethod
    def push(self, text: str) -> Settled:
        """The content and calls that `text`, appended to what came before, settles."""

    @abc.abstractmethod
    def finish(self) -> Settled:
        """What is still held back, settled: the answer has ended."""

    def _content(self, settled: Settled, text: str) -> None:
        combined = self._space + text
        kept = combined.rstrip()
        self._space = combined[len(kept) :]
        if kept:
            settled.append(kept)

    def _call(self, settled: Settled, call: ToolCall) -> None:
        self._space = ""
        self.calls += 1
        settled.append(call)

    def _end(self, settled: Settled) -> Settled:
        if self._space and not self.calls:
            settled.append(self._space)
        self._space = ""
        return settled


class BlockParser(ToolCallParser):
    """Calls are blocks between OPEN and CLOSE among the content; a block whose body is no call
    (or that the answer never closes) is content."""

    OPEN: ClassVar[str]
    CLOSE: ClassVar[str]

    def __init__(self, tools: Sequence[dict] = ()) -> None:
        super().__init__(tools)
        self._pending = ""
        """Text not yet read: an open block, or a tail that may begin one."""

    def block(self, body: str) -> ToolCall | None:
        """The call a block's body (between OPEN and CLOSE) writes; None: no call."""
        raise NotImplementedError

    def push(self, text: str) -> Settled:
        self._pending += text
        settled: Settled = []
        while True:
            start = self._pending.find(self.OPEN)
            if start < 0:
                cut = len(self._pending) - partial_length(self._pending, self.OPEN)
                self._content(settled, self._pending[:cut])
                self._pending = self._pending[cut:]
                return settled
            end = self._pending.find(self.CLOSE, start + len(self.OPEN))
            self._content(settled, self._pending[:start])
            if end < 0:
                self._pending = self._pending[start:]
                return settled
            block = self._pending[start : end + len(self.CLOSE)]
            self._pending = self._pending[end + len(self.CLOSE) :]
            call = self.block(block[len(self.OPEN) : -len(self.CLOSE)])
            if call is None:
                self._content(settled, block)
            else:
                self._call(settled, call)

    def finish(self) -> Settled:
        settled: Settled = []
        self._content(settled, self._pending)
        self._pending = ""
        return self._end(settled)


class TailParser(ToolCallParser):
    """The calls take the rest of the answer from where they start (`start`); held back from
    there to the end, then read as a whole (`tail`). A tail that is no list of calls is
    content."""

    def __init__(self, tools: Sequence[dict] = ()) -> None:
        super().__init__(tools)
        self._seen = ""
        """The whole answer so far."""
        self._sent = 0
        """How much of it was settled as content."""
        self._at: int | None = None
        """Where the calls start, once found."""

    def start(self, text: str) -> tuple[int | None, int]:
        """Where in the answer so far the calls start (None: nowhere yet), and how many
        trailing characters may still begin them."""
        raise NotImplementedError

    def tail(self, text: str) -> list[ToolCall] | None:
        """The calls of the answer's text from their start on; None: it is no list of calls."""
        raise NotImplementedError

    def push(self, text: str) -> Settled:
        self._seen += text
        settled: Settled = []
        if self._at is None:
            at, held = self.start(self._seen)
            cut = at if at is not None else len(self._seen) - held
            self._content(settled, self._seen[self._sent : cut])
            self._sent = max(self._sent, cut)
            self._at = at
        return settled

    def finish(self) -> Settled:
        settled: Settled = []
        calls = self.tail(self._seen[self._at :]) if self._at is not None else None
        if calls:
            for call in calls:
                self._call(settled, call)
        else:
            self._content(settled, self._seen[self._sent :])
        self._sent = len(self._seen)
        return self._end(settled)
