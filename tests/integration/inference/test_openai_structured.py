"""Structured outputs over the OpenAI-compatible API, driven by the real `openai` client: a
service (torch engine process) whose model writes the char tokenizer's alphabet, which has
JSON's characters. The model is random, so only the constraint makes its answers JSON."""

import json

import openai
import pytest

from rlrun.common.tokenizer import load_tokenizer

from .conftest import REPO

OVERRIDES = (
    'model.config="configs/models/tiny-d64.json"',
    'model.tokenizer="configs/tokenizer/char"',
    "model.max_model_len=1024",
    "inference.max_batch_size=8",
)
TOKENIZER = load_tokenizer(REPO / "configs/tokenizer/char")
MESSAGES = [{"role": "user", "content": "Where to?"}]
TRIP = {
    "type": "object",
    "properties": {"city": {"enum": ["paris", "rome"]}, "by_train": {"type": "boolean"}},
    "required": ["city", "by_train"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "book", "parameters": TRIP}},
    {
        "type": "function",
        "function": {
            "name": "wait",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


@pytest.fixture
async def client(start_service):
    service = await start_service(*OVERRIDES)
    async with openai.AsyncOpenAI(
        base_url=f"{service.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


def is_trip(value) -> bool:
    return (
        value.keys() == {"city", "by_train"}
        and value["city"] in ("paris", "rome")
        and isinstance(value["by_train"], bool)
    )


async def test_a_json_schema_response_format_makes_every_choice_a_matching_value(client):
    reply = await client.chat.completions.create(
        model="reverse_text",
        messages=MESSAGES,
        n=4,
        max_tokens=100,
        logprobs=True,
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP}},
    )
    for choice in reply.choices:
        assert is_trip(json.loads(choice.message.content))
        assert choice.finish_reason == "stop"
        # Tokens the grammar forces (a single choice) have logprob 0.
        assert any(entry.logprob == 0.0 for entry in choice.logprobs.content)
    completion = await client.completions.create(
        model="reverse_text",
        prompt="x",
        max_tokens=100,
        extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP}}
        },
    )
    assert is_trip(json.loads(completion.choices[0].text))


async def test_tool_choice_required_answers_with_a_call_of_a_tool_offered(client):
    # One call at most (parallel_tool_calls false): a random model would add calls until
    # max_tokens cut the array short.
    reply = await client.chat.completions.create(
        model="reverse_text",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=140,
        n=4,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert (
            is_trip(arguments)
            if call.function.name == "book"
            else (call.function.name, arguments) == ("wait", {})
        )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_tool_choice_answers_with_one_call_of_it(client, stream):
    named = {"type": "function", "function": {"name": "book"}}
    fields = dict(model="reverse_text", messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=100)
    if not stream:
        reply = await client.chat.completions.create(**fields)
        [choice] = reply.choices
        [call] = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls"
        assert call.function.name == "book" and is_trip(json.loads(call.function.arguments))
        return
    chunks = await client.chat.completions.create(**fields, stream=True)
    content, calls, reasons = "", [], []
    async for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            reasons.append(choice.finish_reason)
    assert content == ""
    [call] = calls
    assert call.function.name == "book" and is_trip(json.loads(call.function.arguments))
    assert reasons[-1] == "tool_calls"


async def test_a_constraint_that_cannot_be_kept_is_a_400_naming_its_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="reverse_text",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "fly"}},
        )
    assert caught.value.body["param"] == "tool_choice.function.name"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="reverse_text",
            messages=MESSAGES,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert caught.value.body["param"] == "response_format.json_schema.schema"
