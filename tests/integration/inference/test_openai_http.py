"""The OpenAI-compatible HTTP API, driven by the real `openai` client."""

import asyncio

import httpx
import openai
import pytest

from rlrun.common.tokenizer import load_tokenizer
from rlrun.inference import metrics
from rlrun.v1 import inference_pb2, sampling_pb2

from .conftest import REPO
from .test_grpc_service import wait_for_status

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
    with pytest.raises(openai.BadRequestError) as caught:  # not a 429: it could never be queued
        await client.completions.create(model="reverse_text", prompt="abc", max_tokens=2, n=5000)
    assert caught.value.body["param"] == "n"
    assert "limits.max_samples" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:  # best_of draws the samples
        await client.completions.create(model="reverse_text", prompt="abc", max_tokens=2, n=2, best_of=5000)
    assert caught.value.body["param"] == "best_of"
    assert caught.value.body["message"].startswith(
        "best_of = 5000 samples exceed the limit limits.max_samples"
    )


async def test_logit_bias_and_penalties_are_honoured_or_refused_by_name(client):
    [x] = load_tokenizer(REPO / "configs/tokenizer/lowercase").encode("x")
    forced = {
        "max_tokens": 6,
        "temperature": 1.0,
        "logit_bias": {str(x): 100},
        "presence_penalty": 0.5,
        "extra_body": {"repetition_penalty": 1.2},
    }
    reply = await client.completions.create(model="reverse_text", prompt="abc", logprobs=0, **forced)
    assert reply.choices[0].text == "xxxxxx"
    assert all(logprob > -1e-3 for logprob in reply.choices[0].logprobs.token_logprobs)
    stream = await client.chat.completions.create(
        model="reverse_text", messages=MESSAGES, stream=True, frequency_penalty=-2.0, **forced
    )
    assert "".join([c.delta.content or "" async for chunk in stream for c in chunk.choices]) == "xxxxxx"
    for bad, param in [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"extra_body": {"repetition_penalty": -1.0}}, "repetition_penalty"),
        ({"logit_bias": {"100000": 5}}, "logit_bias"),
        ({"logit_bias": {"x": 5}}, "logit_bias"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="reverse_text", prompt="abc", max_tokens=2, **bad)
        assert caught.value.body["param"] == param


async def test_min_p_one_draws_the_most_likely_token_only(client):
    settings = {"model": "reverse_text", "prompt": ["abc", "hello"], "max_tokens": 8, "logprobs": 2}
    greedy = await client.completions.create(temperature=0.0, **settings)
    only_top = await client.completions.create(temperature=1.5, n=3, extra_body={"min_p": 1.0}, **settings)
    for index, choice in enumerate(only_top.choices):
        assert choice.text == greedy.choices[index // 3].text
        # The logprobs are those of the distribution drawn from: one token left, so 0; the
        # alternative it cut off reports vLLM's -9999 (JSON has no -inf).
        assert choice.logprobs.token_logprobs and set(choice.logprobs.token_logprobs) == {0.0}
        for top in choice.logprobs.top_logprobs:
            assert sorted(top.values()) == [-9999.0, 0.0]
    assert all(lp < 0 for c in greedy.choices for lp in c.logprobs.token_logprobs)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="reverse_text", prompt="abc", max_tokens=2, extra_body={"min_p": 2.0}
        )
    assert caught.value.body["param"] == "min_p"


async def test_min_tokens_holds_off_the_end_token_and_stop_sequences(client):
    tokenizer = load_tokenizer(REPO / "configs/tokenizer/lowercase")
    [x] = tokenizer.encode("x")
    settings = {"model": "reverse_text", "prompt": "abc", "max_tokens": 8, "temperature": 1.0}
    ending = {str(tokenizer.eos_token_id): 100}
    ended = await client.completions.create(logit_bias=ending, **settings)
    assert ended.usage.completion_tokens == 1 and ended.choices[0].finish_reason == "stop"
    held = await client.completions.create(logit_bias=ending, extra_body={"min_tokens": 5}, n=2, **settings)
    assert held.usage.completion_tokens == 2 * 6  # 5 tokens that are not the end, then the end
    assert [c.finish_reason for c in held.choices] == ["stop", "stop"]
    # "x" may be drawn before min_tokens; only from the 4th on does it end the text.
    for stream in (False, True):
        reply = await client.completions.create(
            logit_bias={str(x): 100}, stop="x", extra_body={"min_tokens": 3}, stream=stream, **settings
        )
        if stream:
            chunks = [chunk async for chunk in reply]
            text = "".join(c.text for chunk in chunks for c in chunk.choices)
            reason = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
        else:
            text, reason = reply.choices[0].text, [reply.choices[0].finish_reason]
        assert (text, reason) == ("xxx", ["stop"])
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(extra_body={"min_tokens": 9}, **settings)
    assert caught.value.body["param"] == "min_tokens"


async def test_best_of_answers_the_best_of_the_same_seeded_samples(client):
    settings = {
        "model": "reverse_text",
        "prompt": ["abc", "hello"],
        "max_tokens": 6,
        "logprobs": 0,
        "seed": 7,
    }
    every = await client.completions.create(n=5, temperature=1.5, **settings)
    best = await client.completions.create(n=2, best_of=5, temperature=1.5, **settings)

    def per_token(choice) -> float:
        return sum(choice.logprobs.token_logprobs) / len(choice.logprobs.token_logprobs)

    for prompt in range(2):
        samples = sorted(every.choices[prompt * 5 : prompt * 5 + 5], key=per_token, reverse=True)
        kept = best.choices[prompt * 2 : prompt * 2 + 2]
        assert [c.text for c in kept] == [c.text for c in samples[:2]]
    assert [c.index for c in best.choices] == [0, 1, 2, 3]
    assert best.usage.completion_tokens == sum(len(c.logprobs.token_logprobs) for c in best.choices)


async def test_a_field_the_server_would_ignore_is_refused_not_dropped(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="reverse_text",
            messages=MESSAGES,
            max_tokens=2,
            prediction={"type": "content", "content": "cba"},
        )
    assert caught.value.body["param"] == "prediction"
    # Kept where it can be (test_openai_structured.py); the demo's alphabet has no "{".
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="reverse_text", messages=MESSAGES, max_tokens=2, response_format={"type": "json_object"}
        )
    assert caught.value.body["param"] == "response_format"
    assert "tokenizer cannot write" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="reverse_text", prompt="abc", max_tokens=2, extra_body={"guided_regex": "a+"}
        )
    assert caught.value.body["param"] == "guided_regex"
    # The values that change nothing are served.
    reply = await client.completions.create(
        model="reverse_text", prompt="abc", max_tokens=2, best_of=1, suffix="", user="bob"
    )
    assert reply.usage.completion_tokens >= 1


async def test_a_body_that_is_no_json_object_gets_an_openai_error(service):
    url = f"{service.http_url}/v1/completions"
    async with httpx.AsyncClient() as http:
        not_json = await http.post(url, content=b"{prompt", headers={"content-type": "application/json"})
        a_list = await http.post(url, json=["abc"])
        no_type = await http.post(url, content=b'{"prompt": "abc"}')
        a_part = await http.post(
            f"{service.http_url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        )
    assert [r.status_code for r in (not_json, a_list, no_type, a_part)] == [400] * 4
    assert not_json.json()["error"]["message"].startswith("the request body is not valid JSON")
    assert a_list.json()["error"]["message"] == "the request body must be a JSON object"
    assert "Content-Type: application/json" in no_type.json()["error"]["message"]
    assert a_part.json()["error"]["param"] == "messages[0].content[0].type"


async def test_health(service):
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{service.http_url}/health")
    assert reply.status_code == 200 and reply.json()["status"] == "ok"


async def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_not_found(client):
    model = await client.models.retrieve("reverse_text")
    assert model.id == "reverse_text"
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("gpt-4")
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["param"] == "model"


BATCH = ["abc", "hello", "xy"]


async def test_a_batch_of_prompts_answers_each_in_openai_order(client):
    greedy = {"model": "reverse_text", "max_tokens": 6, "temperature": 0.0}
    singles = [(await client.completions.create(prompt=p, **greedy)).choices[0].text for p in BATCH]
    assert len(set(singles)) == len(BATCH), "distinct answers, so that the order shows"
    batch = await client.completions.create(prompt=BATCH, n=2, **greedy)
    # Choice i * n + j is sample j of prompt i.
    assert [c.index for c in batch.choices] == list(range(2 * len(BATCH)))
    assert [c.text for c in batch.choices] == [text for text in singles for _ in range(2)]
    assert batch.usage.prompt_tokens == sum(len(p) for p in BATCH)
    token_batch = await client.completions.create(prompt=[[5, 6, 7], [8, 9]], **greedy)
    assert len(token_batch.choices) == 2 and token_batch.usage.prompt_tokens == 5


async def test_a_streamed_batch_equals_the_unstreamed_one(client):
    settings = {"model": "reverse_text", "prompt": BATCH, "max_tokens": 6, "temperature": 0.0}
    whole = await client.completions.create(**settings)
    stream = await client.completions.create(stream=True, stream_options={"include_usage": True}, **settings)
    texts, reasons, usage = [""] * len(BATCH), [None] * len(BATCH), None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            assert reasons[choice.index] is None, "no text after a choice's finish_reason"
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason
    assert texts == [c.text for c in whole.choices]
    assert reasons == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_a_bad_prompt_in_a_batch_is_named(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="reverse_text", prompt=["abc", ""], max_tokens=2)
    assert caught.value.body["param"] == "prompt[1]"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="reverse_text", prompt=[[3], [99999]], max_tokens=2)
    assert caught.value.body["param"] == "prompt[1][0]"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="reverse_text", prompt=["abc", 3], max_tokens=2)
    assert caught.value.body["param"] == "prompt"
    assert "a list of strings or a list of token id lists" in caught.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_batch_the_queue_cannot_hold_is_refused_whole(start_service, stream):
    # A batch within limits.max_samples (derived: at most the queue, 3) that a queue already
    # holding one request has no room for.
    service = await start_service("inference.max_waiting=3")
    await service.stub.Pause(inference_pb2.PauseRequest())  # nothing is admitted: all wait
    holder = asyncio.ensure_future(
        service.stub.Generate(
            inference_pb2.GenerateRequest(
                prompt_token_ids=[4, 5], sampling=sampling_pb2.SamplingParams(temperature=1.0, max_tokens=2)
            )
        )
    )
    await waiting(service, 1)
    async with openai.AsyncOpenAI(
        base_url=f"{service.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        with pytest.raises(openai.RateLimitError):
            await client.completions.create(
                model="reverse_text", prompt=["ab", "cd", "ef"], max_tokens=2, stream=stream
            )
    # The prompts that did fit in the queue left it with the refused one.
    await waiting(service, 1)
    holder.cancel()
    await waiting(service, 0)


async def waiting(service, count: int) -> None:
    """Waits until `count` requests wait in the queue."""
    for _ in range(100):
        status = await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
        if status.waiting_requests == count:
            return
        await asyncio.sleep(0.05)
    assert status.waiting_requests == count


async def test_top_logprobs_list_the_most_likely_tokens_first(client):
    reply = await client.chat.completions.create(
        model="reverse_text", messages=MESSAGES, max_tokens=5, temperature=0.0, logprobs=True, top_logprobs=3
    )
    for entry in reply.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 3
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        # Greedy: the sampled token is the most likely one.
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
    text = await client.completions.create(
        model="reverse_text", prompt="abc", max_tokens=4, temperature=0.0, logprobs=2
    )
    logprobs = text.choices[0].logprobs
    assert len(logprobs.top_logprobs) == len(logprobs.tokens)
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert len(top) == 2 and top[token] == logprob == max(top.values())


async def test_streamed_top_logprobs_equal_the_unstreamed(client):
    settings = {"model": "reverse_text", "messages": MESSAGES, "max_tokens": 6, "temperature": 0.0}
    settings |= {"logprobs": True, "top_logprobs": 2}
    whole = await client.chat.completions.create(**settings)
    stream = await client.chat.completions.create(stream=True, **settings)
    entries = [
        entry
        async for chunk in stream
        for choice in chunk.choices
        for entry in (choice.logprobs.content if choice.logprobs else [])
    ]
    assert [e.model_dump() for e in entries] == [e.model_dump() for e in whole.choices[0].logprobs.content]


async def test_too_many_top_logprobs_are_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="reverse_text", messages=MESSAGES, logprobs=True, top_logprobs=21
        )
    assert caught.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="reverse_text", prompt="abc", logprobs=21)
    assert caught.value.body["param"] == "logprobs"


async def test_echo_scores_the_prompt_as_a_harness_asks(client, service):
    # lm-evaluation-harness's loglikelihood request: the prompt alone, its logprobs, greedy.
    reply = await client.completions.create(
        model="reverse_text", prompt="abcd", max_tokens=0, echo=True, logprobs=1, temperature=0.0
    )
    [choice] = reply.choices
    assert choice.text == "abcd" and reply.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert logprobs.tokens == ["a", "b", "c", "d"] and logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None and all(len(top) == 1 for top in logprobs.top_logprobs[1:])
    # The prompt's logprobs are the model's own: what Score says of the same tokens.
    tokenizer = load_tokenizer(str(REPO / "configs/tokenizer/lowercase"))
    scored = await service.stub.Score(
        inference_pb2.ScoreRequest(token_ids=tokenizer.encode("abcd"), start=1, temperature=1.0)
    )
    assert logprobs.token_logprobs[1:] == pytest.approx(list(scored.logprobs), abs=1e-6)
    rest = zip(logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True)
    for token, logprob, top in rest:
        [(best, best_logprob)] = top.items()
        assert best_logprob >= logprob and (best != token or best_logprob == logprob)


async def test_echo_puts_each_prompt_before_its_completion(client):
    greedy = {"model": "reverse_text", "max_tokens": 3, "temperature": 0.0}
    plain = await client.completions.create(prompt=["ab", "cde"], **greedy)
    echoed = await client.completions.create(prompt=["ab", "cde"], echo=True, logprobs=0, **greedy)
    assert [c.text for c in echoed.choices] == ["ab" + plain.choices[0].text, "cde" + plain.choices[1].text]
    for choice, prompt in zip(echoed.choices, ["ab", "cde"], strict=True):
        assert choice.logprobs.tokens[: len(prompt)] == list(prompt)
        assert choice.logprobs.token_logprobs[0] is None
        assert len(choice.logprobs.token_logprobs) == len(prompt) + 3
    assert echoed.usage == plain.usage
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model="reverse_text", prompt="ab", echo=True, max_tokens=-1)
    assert caught.value.body["param"] == "max_tokens"


async def streamed_choices(stream) -> tuple[list[dict], object]:
    """Each choice of a completion stream, its chunks joined: text, finish_reason, logprobs."""
    choices, usage = {}, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for part in chunk.choices:
            choice = choices.setdefault(part.index, {"text": "", "finish_reason": None, "logprobs": {}})
            assert choice["finish_reason"] is None, "no chunk after a choice's finish_reason"
            choice["text"] += part.text
            choice["finish_reason"] = part.finish_reason
            for key, values in (part.logprobs.model_dump() if part.logprobs else {}).items():
                choice["logprobs"][key] = choice["logprobs"].get(key, []) + values
    return [choices[i] for i in sorted(choices)], usage


@pytest.mark.parametrize("max_tokens", [3, 0])
async def test_a_streamed_echo_equals_the_unstreamed_one(client, max_tokens):
    settings = {"model": "reverse_text", "prompt": ["ab", "cde"], "n": 2, "temperature": 0.0}
    settings |= {"max_tokens": max_tokens, "echo": True, "logprobs": 2}
    whole = await client.completions.create(**settings)
    stream = await client.completions.create(stream=True, stream_options={"include_usage": True}, **settings)
    choices, usage = await streamed_choices(stream)
    assert [c["text"] for c in choices] == [c.text for c in whole.choices]
    assert all(c["text"].startswith(p) for c, p in zip(choices, ["ab", "ab", "cde", "cde"], strict=True))
    assert [c["finish_reason"] for c in choices] == [c.finish_reason for c in whole.choices]
    for streamed, one in zip(choices, whole.choices, strict=True):
        assert_same_logprobs(streamed["logprobs"], one.logprobs.model_dump())
    assert usage == whole.usage


def assert_same_logprobs(streamed: dict, whole: dict) -> None:
    """Tokens and text offsets alike (offsets run on across chunks, through the prompt into
    the completion); logprobs up to float noise, since the prompts of one call may share a
    decode step or not, which changes the batch the logits are computed in."""
    assert streamed["tokens"] == whole["tokens"] and streamed["text_offset"] == whole["text_offset"]
    assert streamed["token_logprobs"] == pytest.approx(whole["token_logprobs"], abs=1e-5)
    assert len(streamed["top_logprobs"]) == len(whole["top_logprobs"])
    for streamed_top, whole_top in zip(streamed["top_logprobs"], whole["top_logprobs"], strict=True):
        assert streamed_top == (None if whole_top is None else pytest.approx(whole_top, abs=1e-5))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": ["ab", "cd"], "max_tokens": 4}),
        ("/v1/completions", {"prompt": "ab", "max_tokens": 4, "echo": True}),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "stream": True}),
    ],
)
async def test_a_client_that_leaves_before_its_answer_frees_the_engine(service, path, body):
    await service.stub.Pause(inference_pb2.PauseRequest())  # nothing runs: requests wait
    async with httpx.AsyncClient() as http:
        call = asyncio.create_task(
            http.post(f"{service.http_url}{path}", json={"model": "reverse_text", **body})
        )
        await asyncio.wait_for(wait_for_status(service.stub, lambda s: s.waiting_requests > 0), 30)
        call.cancel()  # the connection closes
        with pytest.raises(asyncio.CancelledError):
            await call
    # Still paused, so only leaving can have emptied the queue.
    status = await asyncio.wait_for(wait_for_status(service.stub, lambda s: s.waiting_requests == 0), 30)
    assert status.paused


def tokens_through(tokens: list[str], chars: int) -> int:
    """How many tokens it takes for the text to reach `chars` characters (special tokens,
    such as a leading <pad>, show as no text)."""
    seen = 0
    for count, token in enumerate(tokens, 1):
        seen += 0 if token.startswith("<") and token.endswith(">") else len(token)
        if seen >= chars:
            return count
    raise AssertionError(f"{tokens} hold fewer than {chars} characters")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_sequence_ends_the_text_and_the_request(client, stream):
    greedy = {"model": "reverse_text", "prompt": "abc", "temperature": 0.0}
    plain = (await client.completions.create(max_tokens=12, logprobs=0, **greedy)).choices[0]
    assert len(plain.text) >= 6, plain.text
    for stop in (plain.text[3:5], plain.text[3]):  # several tokens (watched as text), one (the engine's)
        cut = plain.text.find(stop)
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        reply = await client.completions.create(max_tokens=20, stop=[stop], stream=stream, **usage, **greedy)
        if stream:
            pieces, reasons, used = [], [], None
            async for chunk in reply:
                used = chunk.usage or used
                for choice in chunk.choices:
                    pieces.append(choice.text)
                    reasons.append(choice.finish_reason)
            text, reason = "".join(pieces), reasons[-1]
        else:
            text, reason, used = reply.choices[0].text, reply.choices[0].finish_reason, reply.usage
        assert (text, reason) == (plain.text[:cut], "stop")
        # Generation ended with the token that completed the stop sequence, not at max_tokens.
        assert used.completion_tokens == tokens_through(plain.logprobs.tokens, cut + len(stop))


async def test_a_chat_stops_at_a_stop_sequence(client):
    settings = {"model": "reverse_text", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0}
    for seed in range(50):  # a sampled answer long enough to hold a stop sequence
        plain = (await client.chat.completions.create(seed=seed, **settings)).choices[0].message.content
        if len(plain) >= 4:
            break
    stop = plain[1:3]
    for stream in (False, True):
        reply = await client.chat.completions.create(seed=seed, stop=stop, stream=stream, **settings)
        if stream:
            chunks = [choice async for chunk in reply for choice in chunk.choices]
            text = "".join(choice.delta.content or "" for choice in chunks)
            reason = chunks[-1].finish_reason
        else:
            text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert (text, reason) == (plain[: plain.find(stop)], "stop")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_whose_choices_all_stopped_leaves_the_engine(start_service, stream):
    # A rotary-position model with room for long answers: its greedy answer to "ab" runs 110
    # tokens, so a request still running when its text stops can only have been cancelled.
    service = await start_service(
        "model.max_model_len=1000",
        f'model.config="{REPO / "configs/models/tiny-d64.json"}"',
        f'model.tokenizer="{REPO / "configs/tokenizer/char"}"',
    )
    async with openai.AsyncOpenAI(
        base_url=f"{service.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        greedy = {"model": "reverse_text", "prompt": "ab", "temperature": 0.0}
        plain = (await client.completions.create(max_tokens=12, **greedy)).choices[0].text
        aborted = metrics.COMPLETIONS.labels("abort")._value.get()
        reply = await client.completions.create(max_tokens=900, stop=plain[4:7], stream=stream, **greedy)
        if stream:
            text = "".join([choice.text async for chunk in reply for choice in chunk.choices])
        else:
            text = reply.choices[0].text
    assert text == plain[: plain.find(plain[4:7])]
    await asyncio.wait_for(wait_for_status(service.stub, lambda s: s.running_requests == 0), 30)
    assert metrics.COMPLETIONS.labels("abort")._value.get() == aborted + 1


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_a_model_not_served_here_is_not_found_in_openais_shape(client, kind):
    if kind == "chat":
        request = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    else:
        request = client.completions.create(model="gpt-4o", prompt="abc", max_tokens=2)
    with pytest.raises(openai.NotFoundError) as caught:
        await request
    assert caught.value.status_code == 404
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["param"] == "model"
    assert caught.value.body["type"] == "invalid_request_error"
    assert "gpt-4o" in caught.value.body["message"]


@pytest.mark.parametrize(
    ("kind", "settings", "param", "requested"),
    [
        ("chat", {"messages": [{"role": "user", "content": "a" * 40}]}, "messages", 44),
        ("chat", {"messages": MESSAGES, "max_tokens": 30}, "max_tokens", 36),
        ("chat", {"messages": MESSAGES, "max_completion_tokens": 30}, "max_completion_tokens", 36),
        ("completion", {"prompt": "a" * 32}, "prompt", 48),  # max_tokens defaults to 16
        ("completion", {"prompt": ["ab", "a" * 20], "max_tokens": 20}, "max_tokens", 40),
    ],
)
async def test_a_request_past_the_context_is_context_length_exceeded(
    client, kind, settings, param, requested
):
    """As OpenAI answers it (code and wording), which litellm and others recognise."""
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    with pytest.raises(openai.BadRequestError) as caught:
        await create(model="reverse_text", **settings)
    body = caught.value.body
    assert (body["code"], body["param"], body["type"]) == (
        "context_length_exceeded",
        param,
        "invalid_request_error",
    )
    assert body["message"].startswith(
        f"This model's maximum context length is 32 tokens. However, you requested {requested} tokens"
    ), body["message"]


async def test_a_request_that_fits_the_context_exactly_is_answered(client):
    reply = await client.completions.create(
        model="reverse_text", prompt="a" * 28, max_tokens=4, temperature=0.0
    )
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= 32
