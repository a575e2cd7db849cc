"""The OpenAI-compatible HTTP API, driven by the real `openai` client."""

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "abc"}]


@pytest.fixture
async def client(service):
    async with openai.AsyncOpenAI(
        base_url=f"{service.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


async def test_models_lists_the_served_model(client):
    models = await client.models.list()
    assert [m.id for m in models.data] == ["reverse_text"]


async def test_chat_completion_with_logprobs(client, service):
    reply = await client.chat.completions.create(
        model="reverse_text", messages=MESSAGES, max_tokens=6, temperature=1.0, logprobs=True, n=2
    )
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert isinstance(choice.message.content, str)
        assert choice.message.role == "assistant"
        assert choice.finish_reason in ("stop", "length")
        assert all(entry.logprob <= 0 for entry in choice.logprobs.content)
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)
    assert reply.usage.prompt_tokens == 6  # <|user|> a b c <|end|> <|assistant|>


async def test_streamed_chat_equals_the_unstreamed_greedy_reply(client):
    settings = {"model": "reverse_text", "messages": MESSAGES, "max_tokens": 12, "temperature": 0.0}
    whole = await client.chat.completions.create(**settings)
    stream = await client.chat.completions.create(stream=True, **settings)
    pieces, reasons = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert "".join(pieces) == whole.choices[0].message.content
    assert reasons[-1] == whole.choices[0].finish_reason
    assert reasons[:-1] == [None] * (len(reasons) - 1)


async def test_text_completion(client):
    reply = await client.completions.create(
        model="reverse_text", prompt="abc", max_tokens=4, temperature=0.0, logprobs=0
    )
    [choice] = reply.choices
    assert len(choice.logprobs.token_logprobs) == reply.usage.completion_tokens <= 4


async def test_bad_requests_get_openai_errors_naming_the_param(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="reverse_text", messages=MESSAGES, temperature=-1.0)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="reverse_text", messages=MESSAGES, max_tokens=1000)
    assert caught.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="reverse_text", messages=[])
    assert caught.value.body["param"] == "messages"


async def test_health(service):
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{service.http_url}/health")
    assert reply.status_code == 200 and reply.json()["status"] == "ok"
