"""An OpenAI request's prompts as the engine's requests: each with its `GenerationParams`,
checked against the model and the engine.

A choice's text ends before its first `stop` sequence (finish_reason "stop"); its tokens and
logprobs run up to the token that completed it. The engine stops on single-token sequences
itself; longer ones are found in the text as it streams (`text.TextStream`), and the request
is cancelled once every choice has stopped. `top_k`, `min_p`, `stop_token_ids` and
`min_tokens` are accepted as vLLM-style extensions; the knobs of the logits processors
(`logit_bias`, `presence_penalty`, `frequency_penalty`, vLLM's `repetition_penalty`, ...) are
read by them (`rlrun.inference.logits`).

A prompt that leaves no room for a token, or whose `max_tokens` runs past the context, is a 400
with code `context_length_exceeded` and OpenAI's wording ("This model's maximum context length
is ..."), which clients such as litellm recognise.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.limits import RequestLimits
from rlrun.inference.engines.base import Engine
from rlrun.inference.logits import Grammar, RequestFields, read_knobs
from rlrun.inference.openai.prompts import PromptBuilder
from rlrun.inference.openai.protocol import SamplingFields
from rlrun.inference.openai.structured_outputs import request_schema
from rlrun.inference.params import GenerationParams
from rlrun.inference.structured import GrammarCompiler
from rlrun.inference.validation import check_generate

BODY = "body"
"""The prefix the sampling fields are validated under, which OpenAI's `param` leaves out."""


def stop_strings(request: SamplingFields) -> list[str]:
    """The request's `stop` sequences: the text of a choice ends before the first of them."""
    strings = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    for i, text in enumerate(strings):
        if not text:
            raise RequestError(f"stop[{i}]", f"stop[{i}] must not be empty")
    return strings


def check_stop_size(stop: str | list[str] | None, limits: RequestLimits, field: str = "stop") -> None:
    """All stop sequences together within `limits.max_text_chars` (each streamed text is
    searched for every one of them)."""
    strings = [stop] if isinstance(stop, str) else stop or []
    limits.check(field, sum(len(text) for text in strings), "max_text_chars", "characters of stop sequences")


def text_stop_strings(request: SamplingFields, tokenizer: Tokenizer) -> list[str]:
    """The stop sequences only the text can show: those of more than one token (the engine
    stops on single-token ones itself), or all of them with `min_tokens`, since vLLM lets a
    single-token stop sequence be drawn before min_tokens (it only does not end the choice
    there), while the engine masks its stop tokens out."""
    if request.min_tokens:
        return stop_strings(request)
    return [text for text in stop_strings(request) if len(tokenizer.encode(text)) != 1]


def _stop_token_ids(request: SamplingFields, tokenizer: Tokenizer) -> list[int]:
    stops = list(tokenizer.stop_token_ids) + list(request.stop_token_ids)
    if not request.min_tokens:
        for text in stop_strings(request):
            ids = tokenizer.encode(text)
            if len(ids) == 1:
                stops.append(ids[0])
    return sorted(set(stops))


def sampling_params(
    request: SamplingFields,
    tokenizer: Tokenizer,
    prompt_len: int,
    max_model_len: int,
    max_tokens: int | None,
    json_schema: str | None = None,
) -> GenerationParams:
    """The engine's settings for a request; `max_tokens` None means the rest of the context;
    `json_schema`: the request's `structured_output`, checked once per request by the caller."""
    if request.top_k < 0:
        raise RequestError("top_k", f"top_k must be >= 0, got {request.top_k}")
    knobs = read_knobs(RequestFields(dict(request)))
    if json_schema is not None:
        knobs[Grammar.name] = json_schema
    return GenerationParams(
        max_tokens=max_tokens if max_tokens is not None else max_model_len - prompt_len,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        stop_token_ids=_stop_token_ids(request, tokenizer),
        seed=request.seed,
        n=request.samples_per_prompt(),
        top_logprobs=request.top_logprobs_count(),
        knobs=knobs,
    )


class ContextLengthExceeded(RequestError):
    """A prompt and completion that do not fit the context (code `context_length_exceeded`)."""

    code = "context_length_exceeded"


def check_context(
    prompt: Sequence[int],
    max_tokens: int,
    max_model_len: int,
    field: str,
    max_tokens_field: str = "max_tokens",
) -> None:
    """OpenAI's context-overflow error for a prompt that leaves no room for a token (naming
    `field`), or whose `max_tokens` runs past the context (naming `max_tokens_field`)."""
    if len(prompt) < max_model_len and len(prompt) + max_tokens <= max_model_len:
        return
    where = "messages" if field == "messages" else "prompt"
    raise ContextLengthExceeded(
        field if len(prompt) >= max_model_len else max_tokens_field,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{len(prompt) + max(max_tokens, 1)} tokens ({len(prompt)} in the {where}, {max(max_tokens, 1)} in the "
        f"completion). Please reduce the length of the {where} or completion.",
    )


def generation_requests(
    body: SamplingFields,
    build_prompts: PromptBuilder,
    max_tokens: int | None,
    engine: Engine,
    tokenizer: Tokenizer,
    grammars: GrammarCompiler,
    limits: RequestLimits,
) -> list[tuple[list[int], GenerationParams]]:
    """Each prompt of the request with its sampling settings, checked against the model and
    `limits` (before any text is encoded)."""
    body.check_fields()
    check_stop_size(body.stop, limits)
    schema = request_schema(body, engine, grammars)
    requests = []
    for field, prompt in build_prompts(body, tokenizer, limits):
        params = sampling_params(body, tokenizer, len(prompt), engine.max_model_len, max_tokens, schema)
        check_context(prompt, params.max_tokens, engine.max_model_len, field, body.max_tokens_field())
        check_generate(
            prompt,
            params,
            vocab_size=engine.vocab_size,
            max_model_len=engine.max_model_len,
            max_samples=limits.max_samples,
            samples_field=body.samples_field(),
            prompt_field=field,
            sampling_field=BODY,
        )
        requests.append((prompt, params))
    return requests
