"""The text-level path over real gRPC (GenerateChat, RenderChat, Tokenize, Detokenize, the
tokenizer in GetStatus): a caller with no tokenizer gets every id a trace needs, and the ids
agree with the token-level Generate on the same prompt."""

import grpc
import pytest

from rlrun.common.tokenizer import CharTokenizer
from rlrun.common.tokenizer_info import tokenizer_info
from rlrun.v1 import inference_pb2, sampling_pb2

from .conftest import REPO


def chat(*pairs) -> list[inference_pb2.ChatMessage]:
    return [inference_pb2.ChatMessage(role=role, content=content) for role, content in pairs]


async def test_render_chat_gives_one_delta_per_message_that_concatenate_to_the_prompt(service):
    messages = chat(("system", "bebrief"), ("user", "abc"))
    reply = await service.stub.RenderChat(
        inference_pb2.RenderChatRequest(messages=messages, add_generation_prompt=True)
    )
    deltas = [list(m.token_ids) for m in reply.messages]
    assert list(reply.token_ids) == deltas[0] + deltas[1] + list(reply.generation_prompt)
    # each delta is the message's own text between its header and the end token
    for message, delta in zip(messages, deltas, strict=True):
        text = await service.stub.Detokenize(inference_pb2.DetokenizeRequest(token_ids=delta[1:-1]))
        assert text.text == message.content
        assert delta[-1] in (await status_tokenizer(service)).stop_token_ids
    assert (
        list((await service.stub.Tokenize(inference_pb2.TokenizeRequest(text="abc"))).token_ids)
        == (deltas[1][1:-1])
    )
    without = await service.stub.RenderChat(inference_pb2.RenderChatRequest(messages=messages))
    assert list(without.generation_prompt) == [] and list(without.token_ids) == deltas[0] + deltas[1]


async def status_tokenizer(service):
    return (await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())).tokenizer


async def test_generate_chat_samples_what_generate_samples_on_the_rendered_prompt(service):
    messages = chat(("user", "hello"))
    sampling = sampling_pb2.SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7)
    reply = await service.stub.GenerateChat(
        inference_pb2.GenerateChatRequest(messages=messages, sampling=sampling)
    )
    prompt = list(reply.prompt.token_ids)
    stops = list((await status_tokenizer(service)).stop_token_ids)
    # The token-level call needs the end token spelled out; the chat call adds it itself.
    token_level = sampling_pb2.SamplingParams()
    token_level.CopyFrom(sampling)
    token_level.stop_token_ids.extend(stops)
    direct = await service.stub.Generate(
        inference_pb2.GenerateRequest(prompt_token_ids=prompt, sampling=token_level)
    )
    assert len(reply.completions) == 3
    for chat_completion, completion in zip(reply.completions, direct.completions, strict=True):
        got = chat_completion.completion
        assert list(got.token_ids) == list(completion.token_ids)
        assert list(got.logprobs) == pytest.approx(list(completion.logprobs))
        assert got.finish_reason == completion.finish_reason
        text = await service.stub.Detokenize(
            inference_pb2.DetokenizeRequest(token_ids=got.token_ids, skip_special_tokens=True)
        )
        assert chat_completion.text == text.text
        if got.finish_reason == inference_pb2.FINISH_REASON_STOP:
            assert got.token_ids[-1] in stops


async def test_generate_chat_fits_max_tokens_to_the_context(service):
    # reverse_text.toml: max_model_len 32; a 20-letter message leaves 32 - 22 - 1 tokens.
    messages = chat(("user", "a" * 20))
    sampling = sampling_pb2.SamplingParams(temperature=1.0, max_tokens=30, seed=1)
    reply = await service.stub.GenerateChat(
        inference_pb2.GenerateChatRequest(messages=messages, sampling=sampling)
    )
    [completion] = reply.completions
    assert len(reply.prompt.token_ids) + len(completion.completion.token_ids) <= 32


async def test_the_status_names_the_tokenizer_and_its_hash_tells_tokenizers_apart(service):
    served = await status_tokenizer(service)
    lowercase = tokenizer_info(CharTokenizer.from_file(REPO / "configs/tokenizer/lowercase"), "x")
    full = tokenizer_info(CharTokenizer.from_file(REPO / "configs/tokenizer/char"), "x")
    assert served.name == "char:lowercase"
    assert served.sha256 == lowercase.sha256 != full.sha256
    assert served.vocab_size == lowercase.vocab_size


@pytest.mark.parametrize(
    ("call", "request_", "field"),
    [
        ("RenderChat", inference_pb2.RenderChatRequest(), "messages"),
        ("RenderChat", inference_pb2.RenderChatRequest(messages=chat(("robot", "x"))), "messages[0].role"),
        (
            "GenerateChat",
            inference_pb2.GenerateChatRequest(
                messages=chat(("user", "a" * 40)), sampling=sampling_pb2.SamplingParams(max_tokens=4)
            ),
            "messages",
        ),
        (
            "GenerateChat",
            inference_pb2.GenerateChatRequest(messages=chat(("user", "a"))),
            "sampling.max_tokens",
        ),
        ("Detokenize", inference_pb2.DetokenizeRequest(token_ids=[4, 999]), "token_ids[1]"),
    ],
)
async def test_bad_text_level_input_is_refused_naming_the_field(service, call, request_, field):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(service.stub, call)(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:"), caught.value.details()
