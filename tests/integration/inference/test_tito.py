"""vLLM's token-in/token-out API (/inference/v1/generate, /tokenize, /detokenize) on a real
`rlrun serve inference --http-port 0` process, driven by verifiers' own train client (the
`renderers` package's `generate()`, with the renderer over the shipped tokenizer folder that
transformers loads) and by plain HTTP for the shapes and errors."""

import importlib
import re

import httpx
import openai
import pytest
import pytest_asyncio

from rlrun.bench.services import start_service, stop_service
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.tokenizer import ChatMessage, load_tokenizer, render_chat
from rlrun.v1 import inference_pb2, inference_pb2_grpc

from .conftest import REPO

renderers = importlib.import_module("renderers")
transformers = importlib.import_module("transformers")
from renderers.client import OverlongPromptError, generate  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = REPO / "configs/reverse_text.toml"
FOLDER = REPO / "configs/tokenizer/lowercase"  # reverse_text's tokenizer
MODEL = "reverse_text"
KEY = "tito-test-key"
MAX_MODEL_LEN = 48


class Server:
    def __init__(self, url: str, address: str):
        self.url = url
        self.address = address
        self.headers = {"Authorization": f"Bearer {KEY}"}

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0)

    async def post(self, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.post(
                f"{self.url}{path}", json=body, headers=self.headers if headers is None else headers
            )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory):
    logs = tmp_path_factory.mktemp("tito")
    (logs / "key").write_text(KEY)
    process, address = await start_service(
        "inference",
        CONFIG,
        logs,
        "--http-port",
        "0",
        overrides=[f'inference.api_key_file="{logs / "key"}"', f"model.max_model_len={MAX_MODEL_LEN}"],
    )
    try:
        line = re.search(r"OpenAI-compatible HTTP on (\S+)/v1", (logs / "inference.log").read_text())
        assert line is not None, (logs / "inference.log").read_text()
        yield Server(line[1], address)
    finally:
        await stop_service(process)


TOKENIZER = load_tokenizer(FOLDER)


def renderer():
    return renderers.create_renderer(
        transformers.AutoTokenizer.from_pretrained(str(FOLDER)), renderers.DefaultRendererConfig()
    )


async def engine_logprobs(
    server: Server, prompt: list[int], completion: list[int], temperature: float
) -> list[float]:
    """The model's own logprobs of `completion` after `prompt` (the gRPC Score RPC)."""
    async with open_channel(server.address, ClientOptions(deadline_s=30)) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        reply = await stub.Score(
            inference_pb2.ScoreRequest(
                token_ids=prompt + completion, start=len(prompt), temperature=temperature
            )
        )
    return list(reply.logprobs)


async def test_the_renderers_client_generates_with_the_models_logprobs(server):
    messages = [{"role": "system", "content": "reverse the text"}, {"role": "user", "content": "abcd"}]
    client = server.client()
    results = []
    for seed in range(4):
        result = await generate(
            client=client,
            renderer=renderer(),
            messages=messages,
            model=MODEL,
            sampling_params={"max_tokens": 10, "temperature": 1.0, "seed": seed},
        )
        results.append(result)
        # The renderer's prompt (transformers' chat template) is rlrun's own rendering.
        assert result["prompt_ids"] == render_chat(TOKENIZER, [ChatMessage(**m) for m in messages])
        ids, logprobs = result["completion_ids"], result["completion_logprobs"]
        assert 1 <= len(ids) <= 10 and len(logprobs) == len(ids)
        assert result["finish_reason"] == ("stop" if ids[-1] == TOKENIZER.eos_token_id else "length")
        assert result["finish_reason"] == "stop" or len(ids) == 10
        assert result["content"] == TOKENIZER.decode(ids)
        assert result["usage"] == {
            "prompt_tokens": len(result["prompt_ids"]),
            "completion_tokens": len(ids),
            "total_tokens": len(result["prompt_ids"]) + len(ids),
        }
        # Each logprob is the sampled token's under the model at the request's temperature.
        assert logprobs == pytest.approx(
            await engine_logprobs(server, result["prompt_ids"], ids, 1.0), abs=1e-4
        )
    assert len({tuple(r["completion_ids"]) for r in results}) > 1  # sampled, not one fixed answer
    again = await generate(
        client=client,
        renderer=renderer(),
        messages=messages,
        model=MODEL,
        sampling_params={"max_tokens": 10, "temperature": 1.0, "seed": 0},
    )
    assert again["completion_ids"] == results[0]["completion_ids"]  # a seed repeats its sample


async def test_the_renderers_client_reads_max_model_len_and_refuses_an_overlong_prompt(server):
    models = await server.client().models.list()
    assert models.data[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    with pytest.raises(OverlongPromptError) as caught:
        await generate(
            client=server.client(),
            renderer=renderer(),
            messages=[{"role": "user", "content": "a" * MAX_MODEL_LEN}],
            model=MODEL,
            sampling_params={"max_tokens": 4},
        )
    assert caught.value.max_prompt_len == MAX_MODEL_LEN


async def test_generate_answers_in_vllms_shape(server):
    prompt = render_chat(TOKENIZER, [ChatMessage("user", "abc")])
    body = {
        "token_ids": prompt,
        "sampling_params": {"max_tokens": 5, "temperature": 0.0, "logprobs": 2, "n": 2},
    }
    reply = await server.post("/inference/v1/generate", body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert set(answer) == {"request_id", "choices", "prompt_logprobs", "kv_transfer_params", "usage"}
    first, second = answer["choices"]
    assert first["token_ids"] == second["token_ids"]  # greedy
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert first["finish_reason"] in ("stop", "length")
    assert first["policy_version_start"] == first["policy_version_end"] == 0
    for token, entry in zip(first["token_ids"], first["logprobs"]["content"], strict=True):
        assert entry["token"] == f"token_id:{token}"
        tops = entry["top_logprobs"]
        # As vLLM: `logprobs` entries, the sampled token first, then the most likely others.
        assert len(tops) == 2 and tops[0] == {
            "token": f"token_id:{token}",
            "logprob": entry["logprob"],
            "bytes": None,
        }
        assert tops[1]["token"] != tops[0]["token"] and tops[1]["logprob"] <= tops[0]["logprob"]  # greedy
    # Without logprobs: none (as vLLM); an absent max_tokens is the rest of the context.
    reply = await server.post(
        "/inference/v1/generate", {"token_ids": prompt, "sampling_params": {"ignore_eos": True}}
    )
    choice = reply.json()["choices"][0]
    assert choice["logprobs"] is None
    assert (len(choice["token_ids"]), choice["finish_reason"]) == (MAX_MODEL_LEN - len(prompt), "length")


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "gpt-4", "token_ids": [3, 6]}, 404, "model", "model_not_found"),
        ({"token_ids": [6] * MAX_MODEL_LEN}, 400, "token_ids", "context_length_exceeded"),
        (
            {"token_ids": [6] * 8, "sampling_params": {"max_tokens": MAX_MODEL_LEN}},
            400,
            "sampling_params.max_tokens",
            "context_length_exceeded",
        ),
        ({"token_ids": [6, 999]}, 400, "token_ids[1]", None),
        ({"token_ids": [6], "sampling_params": {"temprature": 1.0}}, 400, "sampling_params.temprature", None),
        ({"token_ids": [6], "sampling_params": {"bad_words": ["x"]}}, 400, "sampling_params.bad_words", None),
        ({"token_ids": [6], "sampling_params": {"stop": ["ab"]}}, 400, "sampling_params.stop[0]", None),
        (
            {"token_ids": [6], "sampling_params": {"temperature": -1}},
            400,
            "sampling_params.temperature",
            None,
        ),
    ],
)
async def test_generate_refuses_in_openais_error_shape(server, body, status, param, code):
    reply = await server.post("/inference/v1/generate", body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    if code == "context_length_exceeded":
        assert error["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")


async def test_tokenize_and_detokenize_in_vllms_shape(server):
    hf = transformers.AutoTokenizer.from_pretrained(str(FOLDER))
    reply = (
        await server.post("/tokenize", {"model": MODEL, "prompt": "hello there", "return_token_strs": True})
    ).json()
    assert reply == {
        "count": 11,
        "max_model_len": MAX_MODEL_LEN,
        "tokens": hf.encode("hello there"),
        "token_strs": hf.convert_ids_to_tokens(hf.encode("hello there")),  # no space here: "?"
    }
    messages = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cb"}]
    for extra, template in [
        ({}, {"add_generation_prompt": True}),
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        ({"add_generation_prompt": False, "continue_final_message": True}, {"continue_final_message": True}),
    ]:
        reply = (await server.post("/tokenize", {"messages": messages, **extra})).json()
        assert reply["tokens"] == hf.apply_chat_template(
            messages, tokenize=True, return_dict=False, **template
        )
        assert reply["token_strs"] is None
    ids = reply["tokens"]
    assert (await server.post("/detokenize", {"tokens": ids})).json() == {"prompt": hf.decode(ids)}
    bad = await server.post("/detokenize", {"tokens": [6, 500]})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "tokens[1]")
    unknown = await server.post("/tokenize", {"model": "gpt-4", "prompt": "x"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")


@pytest.mark.parametrize("path", ["/inference/v1/generate", "/tokenize", "/detokenize"])
async def test_the_api_key_guards_the_token_routes(server, path):
    reply = await server.post(path, {"token_ids": [6], "prompt": "a", "tokens": [6]}, headers={})
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"
