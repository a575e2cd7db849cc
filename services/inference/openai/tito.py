"""vLLM's token-in/token-out HTTP API over an engine: `POST /inference/v1/generate` (prompt
token ids and vLLM's sampling params in; each sample's token ids, logprobs and finish reason
out), `POST /tokenize` and `POST /detokenize`, in vLLM's shapes
(vllm/entrypoints/serve/disagg/protocol.py, vllm/entrypoints/serve/tokenize). This is what
verifiers' train client (the `renderers` package's `generate()`) calls: it renders the chat
itself, posts the ids, and reads `max_model_len` from `/v1/models`.

Pure of HTTP: `TokensServing` takes the request models and answers dicts; the routes are in
`app`. Text in and out reuse the gRPC text path (`TextPath`): `/tokenize` of a prompt is
its `tokenize`, `/detokenize` its `detokenize`; a chat is rendered as `/v1/chat/completions`
renders it (`chat_prompts`).

Generate: a logprob is the sampled token's under the distribution it was drawn from (as
rlrun's gRPC `Generate`), each entry's `token` is vLLM's `token_id:<id>`, and with
`logprobs` k its `top_logprobs` hold k entries (at least one): the sampled token, then the
most likely others. As vLLM,
generation stops at the tokenizer's end-of-sequence token unless `ignore_eos`, and an absent
`max_tokens` is the room left in the context. Each choice also says which policy versions
sampled it (`policy_version_start`, `policy_version_end`; an rlrun extension). Every sampling
field is honoured or refused with a 400 naming it: the fields that shape only detokenized text
(which this endpoint never returns) are accepted and change nothing; `stop` strings must be one
token each; structured outputs, prompt logprobs, allowed/bad words and logits processors are
refused. A prompt that does not fit the context is a 400 with code `context_length_exceeded`, a
`model` other than the one served a 404 `model_not_found`.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlrun.common.errors import RequestError, describe_validation_error
from rlrun.common.tokenizer import HFTokenizer, Tokenizer
from rlrun.common.wire.inference import Completion, check_token_count
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference.engines.base import Engine
from rlrun.inference.logits import RequestFields, read_knobs
from rlrun.inference.openai.prompts import chat_prompts
from rlrun.inference.openai.protocol import ChatCompletionRequest, ChatMessageIn, ModelNotFound, ToolIn
from rlrun.inference.openai.request_params import check_context, check_stop_size
from rlrun.inference.openai.responses import usage
from rlrun.inference.params import MAX_TOP_LOGPROBS, GenerationParams
from rlrun.inference.text_path import TextPath
from rlrun.inference.validation import check_generate

LOWEST_LOGPROB = -9999.0
"""vLLM's floor for a logprob in JSON."""


class VllmSamplingParams(BaseModel):
    """vLLM's `SamplingParams` (vllm/sampling_params.py), the fields rlrun keeps and the
    ones it accepts at the values that change nothing."""

    model_config = ConfigDict(extra="forbid")

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1: every token."""
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    # Shape only the detokenized text, which this endpoint never returns.
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: int | None = None
    # Refused unless unset.
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: dict | None = None
    guided_decoding: dict | None = None
    logits_processors: list | None = None
    extra_args: dict | None = None

    _REFUSED_UNLESS_UNSET = (
        "prompt_logprobs",
        "truncate_prompt_tokens",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",
        "guided_decoding",
        "logits_processors",
        "extra_args",
    )

    def refuse_unsupported(self) -> None:
        for name in self._REFUSED_UNLESS_UNSET:
            if getattr(self, name):
                raise RequestError(
                    f"sampling_params.{name}", f"sampling_params.{name} is not supported by this server"
                )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                "sampling_params.logprobs",
                f"sampling_params.logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}",
            )


class GenerateRequest(BaseModel):
    """vLLM's `GenerateRequest` (token ids in)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    token_ids: list[int]
    sampling_params: VllmSamplingParams = Field(default_factory=VllmSamplingParams)
    model: str | None = None
    stream: bool = False
    cache_salt: str | None = None
    priority: int = 0


class TokenizeRequest(BaseModel):
    """vLLM's `TokenizeCompletionRequest` (`prompt`) or `TokenizeChatRequest` (`messages`)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    tools: list[ToolIn] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    """True by default for a prompt, False for a chat (its template writes the specials)."""
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


class TokensServing:
    def __init__(self, engine: Engine, text: TextPath, model_id: str, limits: RequestLimits):
        self.engine = engine
        self.text = text
        self.model_id = model_id
        self.limits = limits

    @property
    def tokenizer(self) -> Tokenizer:
        return self.text.tokenizer

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise ModelNotFound(model, self.model_id)

    def sampling(self, request: GenerateRequest) -> GenerationParams:
        """The engine's settings for a request, checked against the context and the model."""
        sp = request.sampling_params
        sp.refuse_unsupported()
        if request.stream:
            raise RequestError(
                "stream", "stream is not supported by /inference/v1/generate here; send stream: false"
            )
        prompt = request.token_ids
        max_len = self.engine.max_model_len
        max_tokens = sp.max_tokens if sp.max_tokens is not None else max_len - len(prompt)
        check_context(prompt, max_tokens, max_len, "token_ids", "sampling_params.max_tokens")
        check_stop_size(sp.stop, self.limits, "sampling_params.stop")
        stops = list(sp.stop_token_ids or ())
        for i, stop in enumerate([sp.stop] if isinstance(sp.stop, str) else sp.stop or ()):
            ids = self.tokenizer.encode(stop)
            if len(ids) != 1:
                raise RequestError(
                    f"sampling_params.stop[{i}]",
                    f"stop strings must be one token each here; {stop!r} is {len(ids)} (use stop_token_ids)",
                )
            stops += ids
        if not sp.ignore_eos:
            stops.append(self.tokenizer.eos_token_id)
        params = GenerationParams(
            max_tokens=max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=max(sp.top_k, 0),
            min_p=sp.min_p,
            stop_token_ids=list(dict.fromkeys(stops)),
            seed=sp.seed,
            n=sp.n,
            top_logprobs=sp.logprobs or 0,
            knobs=read_knobs(RequestFields(dict(sp), "sampling_params")),
        )
        check_generate(
            prompt,
            params,
            vocab_size=self.engine.vocab_size,
            max_model_len=max_len,
            max_samples=self.limits.max_samples,
            prompt_field="token_ids",
            sampling_field="sampling_params",
            samples_field="sampling_params.n",
        )
        return params

    async def generate(self, request: GenerateRequest) -> dict[str, Any]:
        self.check_model(request.model)
        params = self.sampling(request)
        completions = await self.engine.generate(list(request.token_ids), params)
        logprobs = request.sampling_params.logprobs
        choices = [_choice(i, completion, logprobs) for i, completion in enumerate(completions)]
        generated = sum(len(completion.token_ids) for completion in completions)
        return {
            "request_id": request.request_id,
            "choices": choices,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
            "usage": usage(len(request.token_ids), generated),
        }

    def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise RequestError("prompt", "give either prompt (text) or messages (a chat)")
        if request.messages is not None:
            ids = self._render(request)
        else:
            assert request.prompt is not None
            self.limits.check("prompt", len(request.prompt), "max_text_chars", "characters")
            ids = self.text.tokenize(request.prompt)
            if request.add_special_tokens is not False and isinstance(self.tokenizer, HFTokenizer):
                ids = self.tokenizer.hf_tokenizer.encode(request.prompt, add_special_tokens=True)
        return {
            "count": len(ids),
            "max_model_len": self.engine.max_model_len,
            "tokens": ids,
            "token_strs": [self._token_str(t) for t in ids] if request.return_token_strs else None,
        }

    def _render(self, request: TokenizeRequest) -> list[int]:
        """The chat rendered as /v1/chat/completions renders it; `continue_final_message`
        leaves the last message open (no end token, no generation prompt)."""
        if request.continue_final_message and request.add_generation_prompt:
            raise RequestError(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            )
        try:
            chat = ChatCompletionRequest(messages=request.messages, tools=request.tools)
        except ValidationError as error:
            raise RequestError("messages", describe_validation_error(error)) from None
        [(_, ids)] = chat_prompts(chat, self.tokenizer, self.limits)
        header = len(self.tokenizer.message_header("assistant"))
        ids = ids[:-header]  # chat_prompts always ends with the generation prompt
        if request.continue_final_message:
            if ids and ids[-1] in self.tokenizer.stop_token_ids:
                ids = ids[:-1]
        elif request.add_generation_prompt:
            ids += self.tokenizer.message_header("assistant")
        return ids

    def _token_str(self, token: int) -> str:
        if isinstance(self.tokenizer, HFTokenizer):
            return self.tokenizer.hf_tokenizer.convert_ids_to_tokens(token)
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        self.check_model(request.model)
        check_token_count(request.tokens, "tokens", self.engine.max_model_len)
        try:
            text = self.text.detokenize(request.tokens, skip_special_tokens=False)
        except RequestError as error:
            raise RequestError(
                error.field.replace("token_ids", "tokens"), error.message.replace("token_ids", "tokens")
            ) from None
        return {"prompt": text}


def _entry(token: int, logprob: float) -> dict[str, Any]:
    return {"token": f"token_id:{token}", "logprob": max(logprob, LOWEST_LOGPROB), "bytes": None}


def _choice(index: int, completion: Completion, top: int | None) -> dict[str, Any]:
    logprobs = None
    if top is not None:
        content = []
        for i, (token, logprob) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
            entry = _entry(token, logprob)
            alternatives = (completion.top_logprobs or [[]] * len(completion.token_ids))[i]
            ranked = [(token, logprob), *((t, lp) for t, lp in alternatives if t != token)]
            entry["top_logprobs"] = [_entry(t, lp) for t, lp in ranked[: max(top, 1)]]
            content.append(entry)
        logprobs = {"content": content}
    return {
        "index": index,
        "logprobs": logprobs,
        "finish_reason": completion.finish_reason,
        "token_ids": list(completion.token_ids),
        "policy_version_start": completion.policy_version_start,
        "policy_version_end": completion.policy_version_end,
    }
