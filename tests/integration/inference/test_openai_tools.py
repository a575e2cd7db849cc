"""Tool calling over the OpenAI-compatible API, driven by the real `openai` client. The tiny
models never write a tool call, so the answers come from an engine that writes a scripted
text (the HTTP layer is the one `rlrun serve inference` runs)."""

import contextlib
import json
from collections.abc import AsyncIterator, Sequence

import httpx
import openai
import pytest

from rlrun.common.hermes import tools_prompt
from rlrun.common.tokenizer import load_tokenizer
from rlrun.common.wire.inference import Completion
from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.base import Engine, StreamDelta
from rlrun.inference.openai.app import build_openai_app

from ...support.byte_level import byte_level_tokenizer
from ...support.tool_formats import ANSWERS, CALLS, MISTRAL_V11, chat_template
from ...support.tool_formats import TOOLS as TYPED_TOOLS
from .conftest import REPO

TOKENIZER = load_tokenizer(REPO / "configs/tokenizer/char")
ANSWER = (
    "Let me look that up.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
MESSAGES = [{"role": "user", "content": "Weather and time in Paris?"}]
LIMITS = RequestLimits(
    max_group_size=8, max_samples=8, max_messages=64, max_text_chars=65536, max_batch_samples=64
)


class ScriptedEngine(Engine):
    """Writes ANSWER, a token at a time when streamed, and keeps the prompts it was given."""

    name = "scripted"
    model_name = "scripted"
    vocab_size = TOKENIZER.vocab_size
    max_model_len = 4096

    def __init__(self, tokenizer=TOKENIZER, answer: str = ANSWER) -> None:
        self.prompts: list[list[int]] = []
        self.vocab_size = tokenizer.vocab_size
        self.answer = tokenizer.encode(answer)

    @property
    def policy_version(self) -> int:
        return 0

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        self.prompts.append(list(prompt))
        return [Completion(self.answer, [-0.5] * len(self.answer), "stop", 0, 0)] * params.n

    async def stream(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> AsyncIterator[list[StreamDelta]]:
        self.prompts.append(list(prompt))
        for position, token in enumerate(self.answer):
            last = position == len(self.answer) - 1
            yield [StreamDelta(i, [token], [-0.5], "stop" if last else None) for i in range(params.n)]

    async def start(self) -> None:
        raise AssertionError("not used here")

    stop = score = update_weights = receive_weights_nccl = pause = resume = start

    def weight_specs(self):
        raise AssertionError("not used here")

    status = weight_specs


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@contextlib.asynccontextmanager
async def openai_client(app) -> AsyncIterator[openai.AsyncOpenAI]:
    """The real `openai` client, talking HTTP to `app` in this process."""
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://scripted") as http,
        openai.AsyncOpenAI(
            base_url="http://scripted/v1", api_key="unused", http_client=http, max_retries=0
        ) as client,
    ):
        yield client


@pytest.fixture
async def client(engine):
    async with openai_client(build_openai_app(engine, TOKENIZER, "scripted", lambda: True, LIMITS)) as client:
        yield client


async def test_the_answers_tool_calls_come_back_as_tool_calls(client, engine):
    reply = await client.chat.completions.create(model="scripted", messages=MESSAGES, tools=TOOLS)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look that up."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "CET"}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    # The model was shown the tools.
    assert tools_prompt(TOOLS) in TOKENIZER.decode(engine.prompts[-1])


async def test_streamed_tool_calls_equal_the_whole_answers(client):
    stream = await client.chat.completions.create(
        model="scripted", messages=MESSAGES, tools=TOOLS, stream=True
    )
    content, calls, reasons = "", {}, []
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                calls.setdefault(call.index, []).append(call)
            reasons.append(choice.finish_reason)
    assert content == "Let me look that up."
    assert [
        (parts[0].function.name, json.loads(parts[0].function.arguments)) for parts in calls.values()
    ] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "CET"}),
    ]
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}


async def test_a_conversation_goes_on_after_the_tools_answer(client, engine):
    first = await client.chat.completions.create(
        model="scripted", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False
    )
    [call] = first.choices[0].message.tool_calls
    follow_up = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    await client.chat.completions.create(model="scripted", messages=follow_up, tools=TOOLS)
    shown = TOKENIZER.decode(engine.prompts[-1])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in shown
    assert "sunny, 21 C" in shown


async def test_tool_choices_an_engine_cannot_keep_are_refused(client):
    """This engine does not constrain its output (`Engine.structured_outputs`); the torch
    engine does (test_openai_structured.py)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="scripted", messages=MESSAGES, tools=TOOLS, tool_choice="required"
        )
    assert caught.value.body["param"] == "tool_choice"
    plain = await client.chat.completions.create(
        model="scripted", messages=MESSAGES, tools=TOOLS, tool_choice="none"
    )
    assert plain.choices[0].message.content == ANSWER and plain.choices[0].message.tool_calls is None


def strict_json(text: str):
    """json.loads that refuses what JSON cannot hold (NaN, Infinity: Python's extensions)."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


async def answered(client, engine, answer: str, stream: bool = False, **settings):
    """The message (content, tool_calls as dicts) of a chat whose model writes `answer`; streamed
    deltas are joined."""
    engine.answer = TOKENIZER.encode(answer)
    reply = await client.chat.completions.create(
        model="scripted", messages=MESSAGES, tools=TOOLS, stream=stream, **settings
    )
    if not stream:
        message = reply.choices[0].message
        calls = [call.model_dump() for call in message.tool_calls or ()]
        return message.content, calls, reply.choices[0].finish_reason
    content, calls, reason = "", [], None
    async for chunk in reply:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += [call.model_dump(exclude_none=True) for call in choice.delta.tool_calls or ()]
            reason = choice.finish_reason or reason
    return content or None, calls, reason


class ConstrainingEngine(ScriptedEngine):
    """Claims to constrain its output, as the torch engine does, but writes its script: the
    constraint lets through numbers JSON cannot hold (a grammar's number may have any
    exponent), which is what the HTTP layer must catch."""

    structured_outputs = True


@pytest.fixture
async def constrained():
    engine = ConstrainingEngine()
    app = build_openai_app(engine, TOKENIZER, "scripted", lambda: True, LIMITS)
    async with openai_client(app) as client:
        yield client, engine


@pytest.mark.parametrize("stream", [False, True])
async def test_forced_calls_keep_the_models_own_json_and_refuse_what_json_cannot_hold(constrained, stream):
    client, engine = constrained
    written = '{"city": "Paris", "days": 1.50e2, "note": "\\u00e9t\\u00e9"}'
    for tool_choice, answer in [
        ("required", f'[{{"name": "get_weather", "parameters": {written}}}]'),
        ({"type": "function", "function": {"name": "get_weather"}}, written),
    ]:
        content, calls, reason = await answered(client, engine, answer, stream, tool_choice=tool_choice)
        assert (content, reason) == (None, "tool_calls")
        [call] = calls
        # The model's own text, byte for byte (not re-dumped: 1.50e2 stays, escapes stay).
        assert call["function"] == {"name": "get_weather", "arguments": written}
        assert strict_json(call["function"]["arguments"])["days"] == 150.0
    for huge in ("1e999", "-2.5E+400", "NaN", "Infinity"):
        bad = f'{{"city": "Paris", "days": {huge}}}'
        for tool_choice, answer in [
            ("required", f'[{{"name": "get_weather", "parameters": {bad}}}]'),
            ({"type": "function", "function": {"name": "get_weather"}}, bad),
        ]:
            content, calls, reason = await answered(client, engine, answer, stream, tool_choice=tool_choice)
            # No call with arguments that are not JSON: the text stays the content.
            assert (content, calls, reason) == (answer, [], "stop"), huge


@pytest.mark.parametrize("stream", [False, True])
async def test_parsed_calls_keep_the_models_own_json_and_refuse_what_json_cannot_hold(client, engine, stream):
    kept = '{"city": "Paris", "days": 1.5e2}'
    refused = '<tool_call>\n{"name": "get_time", "arguments": {"offset": 1e999}}\n</tool_call>'
    answer = f'<tool_call>\n{{"name": "get_weather", "arguments": {kept}}}\n</tool_call>\n{refused}'
    content, calls, reason = await answered(client, engine, answer, stream)
    assert [call["function"] for call in calls] == [{"name": "get_weather", "arguments": kept}]
    # The refused block stays in the content, as the model wrote it (the line break before it
    # is the content's: only whitespace a call follows is the format's).
    assert content == f"\n{refused}" and reason == "tool_calls"
    for call in calls:
        strict_json(call["function"]["arguments"])


async def chat(client, stream: bool) -> tuple[str | None, list[tuple[str, dict]], str | None]:
    """A chat's content, calls (name, arguments) and finish reason; streamed deltas joined."""
    reply = await client.chat.completions.create(
        model="scripted", messages=MESSAGES, tools=TYPED_TOOLS, stream=stream
    )
    if not stream:
        message = reply.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
        return message.content, calls, reply.choices[0].finish_reason
    content, parts, reason = "", {}, None
    async for chunk in reply:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                parts.setdefault(call.index, []).append(call)
            reason = choice.finish_reason or reason
    calls = [
        (pieces[0].function.name, json.loads("".join(p.function.arguments or "" for p in pieces)))
        for pieces in parts.values()
    ]
    return content or None, calls, reason


@pytest.fixture
def template_tokenizer(tmp_path):
    """A Hugging Face tokenizer (byte-level: it encodes any answer) whose chat template teaches
    the format named."""

    def make(name: str):
        folder = tmp_path / name
        byte_level_tokenizer("<|im_end|>", ["<|im_start|>"], chat_template(name)).save_pretrained(folder)
        return load_tokenizer(folder)

    return make


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("name", "answer"),
    [*((name, text) for name, (text, _) in sorted(ANSWERS.items())), ("mistral", MISTRAL_V11)],
)
async def test_auto_reads_the_calls_of_the_format_the_chat_template_teaches(
    template_tokenizer, name, answer, stream
):
    """`tool_call_parser = "auto"` (the default): the tokenizer's chat template decides; the
    real `openai` client gets the same content and calls whole and streamed."""
    tokenizer = template_tokenizer(name)
    engine = ScriptedEngine(tokenizer, answer)
    app = build_openai_app(engine, tokenizer, "scripted", lambda: True, LIMITS)
    async with openai_client(app) as client:
        content, calls, reason = await chat(client, stream)
    assert calls == CALLS
    assert reason == "tool_calls"
    assert content == (None if name == "llama3_json" else "Let me look.")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_parser_wins_over_the_template(template_tokenizer, stream):
    """The template teaches Hermes; `tool_call_parser = "qwen3_coder"` reads Qwen3-Coder's XML
    (and would leave a Hermes answer as content)."""
    tokenizer = template_tokenizer("hermes")
    for parser, answer, expected in [
        ("qwen3_coder", ANSWERS["qwen3_coder"][0], CALLS),
        ("qwen3_coder", ANSWERS["hermes"][0], []),
        ("hermes", ANSWERS["hermes"][0], CALLS),
    ]:
        engine = ScriptedEngine(tokenizer, answer)
        app = build_openai_app(engine, tokenizer, "scripted", lambda: True, LIMITS, tool_call_parser=parser)
        async with openai_client(app) as client:
            content, calls, _ = await chat(client, stream)
        assert calls == expected, parser
        assert (content == answer) is (not expected)
