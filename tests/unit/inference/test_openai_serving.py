"""OpenAIServing without HTTP: request models in, bodies and chunks out, over a torch engine
with a tiny model."""

from __future__ import annotations

import pytest

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import CharTokenizer
from rlrun.inference.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelNotFound
from rlrun.inference.openai.serving import OpenAIServing
from rlrun.inference.openai.tool_parsers.hermes import HermesParser
from rlrun.inference.params import GenerationParams

from .conftest import LIMITS, REPO

TOKENIZER = CharTokenizer.from_file(REPO / "configs/tokenizer/char")
MESSAGES = [{"role": "user", "content": "abc"}]


@pytest.fixture
def serving(engine) -> OpenAIServing:
    return OpenAIServing(engine, TOKENIZER, "tiny", LIMITS, HermesParser)


async def test_a_greedy_completion_is_the_engines_greedy_text(serving, engine):
    prompt = TOKENIZER.encode("abc")
    body = await serving.completions(CompletionRequest(prompt="abc", max_tokens=6, temperature=0.0, n=2))
    stops = sorted(set(TOKENIZER.stop_token_ids))
    [expected] = await engine.generate(
        prompt, GenerationParams(max_tokens=6, temperature=0.0, stop_token_ids=stops)
    )
    assert [c["text"] for c in body["choices"]] == [TOKENIZER.decode(expected.token_ids)] * 2
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 2 * len(expected.token_ids),
        "total_tokens": len(prompt) + 2 * len(expected.token_ids),
    }


async def test_a_streamed_chat_adds_up_to_the_whole_answer(serving):
    settings = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0.0}
    whole = await serving.chat(ChatCompletionRequest(**settings))
    assert isinstance(whole, dict)
    chunks = [chunk async for chunk in await serving.chat(ChatCompletionRequest(stream=True, **settings))]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks[1:])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


async def test_echo_without_tokens_scores_the_prompt(serving, engine):
    prompt = TOKENIZER.encode("abcd")
    body = await serving.completions(CompletionRequest(prompt="abcd", max_tokens=0, echo=True, logprobs=1))
    [choice] = body["choices"]
    assert choice["text"] == "abcd" and choice["finish_reason"] == "length"
    score = await engine.score(prompt, 1, 1.0)
    assert choice["logprobs"]["token_logprobs"] == [None, *score.logprobs]
    assert body["usage"]["completion_tokens"] == 0


async def test_bad_requests_raise_naming_the_field(serving):
    with pytest.raises(ModelNotFound):
        await serving.chat(ChatCompletionRequest(model="other", messages=MESSAGES))
    with pytest.raises(RequestError) as caught:
        await serving.completions(CompletionRequest(prompt="abc", temperature=-1.0))
    assert caught.value.field == "body.temperature"
    with pytest.raises(RequestError) as caught:
        await serving.completions(CompletionRequest(prompt="abc", logit_bias={"5": 500}))
    assert caught.value.field == "body.logit_bias"
    with pytest.raises(RequestError) as caught:  # a field no knob reads
        await serving.completions(CompletionRequest(prompt="abc", banned_token_ids=[3]))
    assert caught.value.field == "banned_token_ids"
    assert (await serving.model("tiny"))["id"] == "tiny"


async def test_an_empty_token_id_prompt_is_one_empty_prompt_not_an_empty_batch(serving):
    with pytest.raises(RequestError) as caught:
        await serving.completions(CompletionRequest(prompt=[], max_tokens=4))
    assert caught.value.field == "prompt"
