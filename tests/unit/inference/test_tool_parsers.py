"""The tool-call parsers (one per format) on strings in their format: the whole answer and the
same answer pushed in pieces split into the same content and calls; text that is no call of
the format stays content; `auto` picks the format a chat template teaches."""

from __future__ import annotations

import json

import pytest

from rlrun.inference.openai.tool_calls import split_tool_calls
from rlrun.inference.openai.tool_parsers import PARSERS, ToolCall, choose_parser
from rlrun.inference.openai.tool_parsers.hermes import HermesParser
from rlrun.inference.openai.tool_parsers.llama3_json import Llama3JsonParser
from rlrun.inference.openai.tool_parsers.mistral import MistralParser
from rlrun.inference.openai.tool_parsers.qwen3_coder import Qwen3CoderParser

from ...support.tool_formats import ANSWERS, CALLS, MISTRAL_V11, TEMPLATES, TOOLS


def streamed(parser, text: str, piece: int) -> tuple[str, list[ToolCall]]:
    stream = parser(TOOLS)
    items = []
    for start in range(0, len(text), piece):
        items += stream.push(text[start : start + piece])
    items += stream.finish()
    return "".join(i for i in items if isinstance(i, str)), [i for i in items if isinstance(i, ToolCall)]


def named(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


def test_every_format_is_registered_under_its_name():
    assert {"hermes", "qwen3_coder", "llama3_json", "mistral"} <= set(PARSERS)
    for name in ANSWERS:
        assert PARSERS[name].name == name


@pytest.mark.parametrize("name", sorted(ANSWERS))
@pytest.mark.parametrize("piece", [1, 2, 5, 13, 10_000])
def test_each_format_splits_the_same_whole_and_streamed(name, piece):
    parser = PARSERS[name]
    text, content = ANSWERS[name]
    whole_content, whole_calls = split_tool_calls(text, parser, TOOLS)
    assert whole_content == content
    assert named(whole_calls) == CALLS
    stream_content, stream_calls = streamed(parser, text, piece)
    assert stream_content == (content or "")
    assert [(c.name, c.arguments) for c in stream_calls] == [(c.name, c.arguments) for c in whole_calls]


@pytest.mark.parametrize("piece", [1, 3, 10_000])
def test_mistral_v11_writes_each_call_after_its_own_marker(piece):
    content, calls = split_tool_calls(MISTRAL_V11, MistralParser, TOOLS)
    assert content == "Let me look." and named(calls) == CALLS
    assert streamed(MistralParser, MISTRAL_V11, piece)[0] == "Let me look."


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (HermesParser, 'ok <tool_call>{"name": "f", "arguments": [1]}</tool_call>'),
        (HermesParser, 'ok <tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'),
        (Qwen3CoderParser, "ok <tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>"),
        (Qwen3CoderParser, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),  # Hermes, not XML
        (Llama3JsonParser, 'Sure: {"name": "f", "parameters": {}}'),  # calls only at the start
        (Llama3JsonParser, '{"name": "f", "parameters": {}} and some words'),
        (Llama3JsonParser, '{"name": "f", "parameters": {"x": 1e999}}'),
        (MistralParser, "ok [TOOL_CALLS] not a call"),
        (MistralParser, 'ok [TOOL_CALLS][{"name": "f", "arguments": {"x": 1}'),  # cut short
        (HermesParser, "ok <tool_call>{"),  # never closed
    ],
)
@pytest.mark.parametrize("piece", [1, 4, 10_000])
def test_text_that_is_no_call_of_the_format_stays_the_content(parser, text, piece):
    assert split_tool_calls(text, parser, TOOLS) == (text, [])
    assert streamed(parser, text, piece) == (text, [])


def test_content_streams_before_the_calls_end_and_a_tail_that_may_begin_one_waits():
    mistral = MistralParser(TOOLS)
    assert mistral.push("Let me look.[TOOL") == ["Let me look."]
    assert mistral.push('_CALLS][{"name": "get_time", "arguments": {}}]') == []
    assert named([c for c in mistral.finish() if isinstance(c, ToolCall)]) == [("get_time", {})]
    llama = Llama3JsonParser(TOOLS)
    assert llama.push("  <|pyth") == []
    assert llama.push("on_tag|>") == []
    assert llama.push("x") == []  # held: the tail starts at the tag, read once it has ended
    plain = Llama3JsonParser(TOOLS)
    assert plain.push("Paris is sunny") == ["Paris is sunny"]


def test_qwen3_coder_values_take_the_type_the_tool_declares():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n3\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=hourly>\ntrue\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    content, [call] = split_tool_calls(text, Qwen3CoderParser, TOOLS)
    assert content is None
    # city is a string (kept as text), days an integer, hourly a boolean; note is undeclared: text.
    assert json.loads(call.arguments) == {
        "city": "3",
        "days": 3,
        "hourly": True,
        "note": "line one\nline two",
    }
    unknown_tool = text.replace("get_weather", "not_offered")
    assert json.loads(split_tool_calls(unknown_tool, Qwen3CoderParser, TOOLS)[1][0].arguments)["days"] == "3"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_auto_picks_the_format_the_chat_template_teaches(name):
    assert choose_parser("auto", "{{ bos_token }}" + TEMPLATES[name] + "{{ eos_token }}").name == name


def test_auto_without_a_template_that_teaches_one_is_hermes_and_a_name_wins():
    assert choose_parser("auto", None) is HermesParser  # the char tokenizer: rlrun's Hermes prompt
    assert choose_parser("auto", "{% for m in messages %}{{ m.content }}{% endfor %}") is HermesParser
    assert choose_parser("mistral", TEMPLATES["hermes"]) is MistralParser
    with pytest.raises(
        ValueError, match=r"unknown tool-call parser 'qwen3_coda' \(did you mean qwen3_coder\?\)"
    ):
        choose_parser("qwen3_coda", None)
