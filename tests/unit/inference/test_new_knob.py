"""A new OpenAI sampling knob is one logits processor and its registration: this test defines
one (`banned_token_ids`: those tokens are never drawn), registers it, and sends real OpenAI
requests (the `openai` client, over the app, to a torch engine with a tiny model), which obey
it and refuse a bad value with a 400 naming it. Nothing else learns of the knob."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import httpx
import openai
import pytest
import torch

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import CharTokenizer
from rlrun.inference.engines.core_protocol import Submit
from rlrun.inference.engines.torch_engine import TorchEngine
from rlrun.inference.engines.vllm_engine import sampling_kwargs
from rlrun.inference.logits import PROCESSORS, History, LogitsProcessor, RequestFields, register
from rlrun.inference.logits.base import token_mask
from rlrun.inference.openai.app import build_openai_app
from rlrun.inference.params import GenerationParams

from .conftest import LIMITS, MAX_MODEL_LEN, REPO

TOKENIZER = CharTokenizer.from_file(REPO / "configs/tokenizer/char")
PROMPT = [5, 6, 7, 8]


class BannedTokens(LogitsProcessor):
    """Settings: the token ids a sample may never draw."""

    name = "banned_token_ids"
    fields = ("banned_token_ids",)

    def __init__(self, rows: torch.Tensor, banned: list[tuple[int, ...]]):
        self.rows = rows
        self.banned = banned

    @classmethod
    def read(cls, fields: RequestFields) -> tuple[int, ...] | None:
        value = fields.values.get("banned_token_ids")
        if value is None:
            return None
        if not isinstance(value, list) or not all(type(token) is int for token in value):
            field = fields.field("banned_token_ids")
            raise RequestError(field, f"{field} must be a list of token ids, got {value!r}")
        return tuple(value) or None

    @classmethod
    def check(cls, settings, params, where: str, vocab_size: int | None) -> None:
        for token in settings:
            if vocab_size is not None and not 0 <= token < vocab_size:
                field = f"{where}.banned_token_ids"
                raise RequestError(field, f"{field} has {token}, outside the vocabulary [0, {vocab_size})")

    @classmethod
    def create(
        cls, rows: Sequence[tuple[int, tuple[int, ...]]], device: torch.device | str, history: History | None
    ) -> BannedTokens:
        return cls(torch.tensor([row for row, _ in rows], device=device), [banned for _, banned in rows])

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        mask = token_mask(self.banned, logits.shape[-1], logits.device)
        rows = logits.index_select(0, self.rows).masked_fill(mask, float("-inf"))
        return logits.index_copy(0, self.rows, rows)


@pytest.fixture
def banned_knob():
    register(BannedTokens)
    yield BannedTokens
    del PROCESSORS[BannedTokens.name]


@pytest.fixture
async def client(model):
    engine = TorchEngine(
        model, model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=8, max_waiting=64, seed=0
    )
    await engine.start()
    app = build_openai_app(engine, TOKENIZER, "tiny", lambda: True, LIMITS)
    try:
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiny") as http,
            openai.AsyncOpenAI(
                base_url="http://tiny/v1", api_key="unused", http_client=http, max_retries=0
            ) as client,
        ):
            yield client
    finally:
        await engine.stop()


def token_texts(choice) -> list[str]:
    return choice.logprobs.tokens


async def test_a_registered_knob_is_obeyed_through_the_openai_api(banned_knob, client):
    settings = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "logprobs": 0}
    greedy = await client.completions.create(temperature=0.0, **settings)
    drawn = token_texts(greedy.choices[0])
    assert drawn
    banned = sorted({TOKENIZER.encode(text)[0] for text in drawn if len(TOKENIZER.encode(text)) == 1})
    assert banned
    banned_texts = {TOKENIZER.decode([t], skip_special_tokens=False) for t in banned}
    for temperature, n in ((0.0, 1), (1.0, 4)):
        reply = await client.completions.create(
            temperature=temperature, n=n, extra_body={"banned_token_ids": banned}, **settings
        )
        for choice in reply.choices:
            assert token_texts(choice) and not set(token_texts(choice)) & banned_texts
    # and in a chat, alongside a built-in knob
    chat = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "abc"}],
        max_tokens=8,
        temperature=0.0,
        logprobs=True,
        presence_penalty=0.5,
        extra_body={"banned_token_ids": banned},
    )
    assert not {entry.token for entry in chat.choices[0].logprobs.content} & banned_texts


@pytest.mark.parametrize("value", [[100_000], "x", [1.5]])
async def test_a_bad_value_of_a_registered_knob_is_a_400_naming_it(banned_knob, client, value):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"banned_token_ids": value}
        )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "banned_token_ids"


async def test_a_knob_nobody_registered_is_an_unrecognized_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2, extra_body={"banned_token_ids": [3]}
        )
    assert caught.value.body["param"] == "banned_token_ids"
    assert "unrecognized" in caught.value.body["message"]


def test_vllm_refuses_a_knob_it_has_no_equivalent_of(banned_knob):
    params = GenerationParams(max_tokens=4, knobs={"banned_token_ids": (3,)})
    with pytest.raises(RequestError) as caught:
        sampling_kwargs(params)
    assert caught.value.field == "banned_token_ids"
    assert "banned_token_ids" not in sampling_kwargs(GenerationParams(max_tokens=4))


def test_knobs_cross_to_the_engine_process_as_they_are():
    """The engine process gets its commands pickled: the knobs' settings survive it."""
    from ...support.knobs import knobbed

    params = knobbed(max_tokens=4, logit_bias={3: 1.0}, presence_penalty=0.5, min_tokens=2, json_schema="{}")
    back = pickle.loads(pickle.dumps(Submit(1, [5], params, False, 0.0)))
    assert isinstance(back.params, GenerationParams) and back.params == params
