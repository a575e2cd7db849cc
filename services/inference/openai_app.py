"""The OpenAI-compatible HTTP API over an engine: /v1/models, /v1/completions,
/v1/chat/completions (with `stream: true` as server-sent events) and /health; and vLLM's
token-in/token-out API, /inference/v1/generate, /tokenize and /detokenize (`tito`).

Errors use OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a
bad request (the `param` names the field; code `context_length_exceeded` when it does not fit
the context), 404 `model_not_found` for a model not served here, 429 when the waiting queue is
full.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rlrun.common.aio import all_or_nothing
from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import Tokenizer
from rlrun.inference.batch_calls import primed_streams
from rlrun.inference.engines.base import Completion, Engine, QueueFullError, StreamDelta
from rlrun.inference.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Echo,
    TextStream,
    best_of_each,
    chat_body,
    chat_logprobs,
    chat_prompts,
    check_context,
    completion_body,
    completion_logprobs,
    completion_prompts,
    error_body,
    model_not_found,
    new_id,
    now,
    sampling_params,
    stop_strings,
    text_stop_strings,
    usage,
)
from rlrun.inference.params import GenerationParams
from rlrun.inference.structured import GrammarCompiler
from rlrun.inference.text_path import TextPath
from rlrun.inference.tito import (
    DetokenizeRequest,
    GenerateRequest,
    ModelNotFound,
    TokenizeRequest,
    TokensServing,
)
from rlrun.inference.tool_calls import ToolCall, ToolCallStream, forced_tool_calls
from rlrun.inference.validation import check_generate
from rlrun.v1 import plan_pb2

# Sampling fields are validated under this prefix, which OpenAI's `param` leaves out.
_BODY = "body"


def _bad_request(error: RequestError) -> JSONResponse:
    param = error.field.removeprefix(f"{_BODY}.")
    message = str(error.message).replace(f"{_BODY}.", "")
    code = getattr(error, "code", None)
    return JSONResponse(error_body(message, param, code=code), status_code=400)


def _validation_message(error: dict, content_type: str) -> tuple[str, str | None]:
    """A validation error's message and the param it names, spelled as OpenAI does
    (`messages[0].role`); a body that is no JSON object is named as such."""
    loc = list(error.get("loc", ()))
    if loc[:1] == [_BODY]:
        loc = loc[1:]
    kind = error.get("type")
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', 'unreadable')}", None
    if not loc and kind in ("missing", "model_attributes_type", "dict_type"):
        if "json" not in content_type:  # FastAPI reads no other body as JSON
            return (
                f"the request body must be JSON, sent as Content-Type: application/json (got {content_type!r})",
                None,
            )
        return "the request body must be a JSON object", None
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).removeprefix(".") or None
    message = str(error.get("msg"))
    return (f"{param}: {message}" if param else message), param


async def _tokens_answer(work: Awaitable[dict]) -> Response:
    """A token-in/token-out answer, or its error in OpenAI's shape (as vLLM answers them)."""
    try:
        return JSONResponse(await work)
    except RequestError as error:
        return _bad_request(error)
    except ModelNotFound as error:
        return JSONResponse(model_not_found(error.model, error.served), status_code=404)
    except QueueFullError as error:
        return _queue_full(error)


def _queue_full(error: QueueFullError) -> JSONResponse:
    return JSONResponse(error_body(str(error), None, "rate_limit_error"), status_code=429)


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def lines():
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


async def _unless_the_client_leaves(request: Request, answer: Awaitable[Response]) -> Response:
    """The answer, unless the client disconnects first: then the work is cancelled, so its
    requests leave the engine and free their slots at once, and nobody is answered. (Once a
    stream has started, StreamingResponse watches for the disconnect itself.)"""
    work = asyncio.ensure_future(answer)
    left = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait([work, left], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        left.cancel()
        raise
    left.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


async def _disconnect(request: Request) -> None:
    # The body is read already, so the next message the server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_openai_app(  # noqa: C901 - the routes' closure; it splits into inference/openai/ (issue 31 item 3, not done yet)
    engine: Engine,
    tokenizer: Tokenizer,
    model_id: str,
    is_ready: Callable[[], bool],
    text: TextPath | None = None,
) -> FastAPI:
    """`text`: the gRPC text path the token-in/token-out routes share (one over `tokenizer`
    when not given)."""
    app = FastAPI(title="rlrun inference", description="OpenAI-compatible API over the live policy.")
    grammars = GrammarCompiler(lambda: tokenizer)
    if text is None:
        info = plan_pb2.TokenizerInfo(
            vocab_size=tokenizer.vocab_size, stop_token_ids=tokenizer.stop_token_ids
        )
        text = TextPath(tokenizer, info)
    tokens = TokensServing(engine, text, model_id)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
        message, param = _validation_message(first, request.headers.get("content-type", ""))
        return JSONResponse(error_body(message, param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(error.detail), None, kind), status_code=error.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = is_ready()
        body = {"status": "ok" if ready else "not ready", "policy_version": engine.policy_version}
        return JSONResponse(body, status_code=200 if ready else 503)

    def model_card() -> dict:
        return {
            "id": model_id,
            "object": "model",
            "created": now(),
            "owned_by": "rlrun",
            "max_model_len": engine.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != model_id:
            return JSONResponse(model_not_found(model, model_id), status_code=404)
        return model_card()

    def checked(body, build_prompts, max_tokens: int | None) -> list[tuple[list[int], GenerationParams]]:
        """Each prompt of the request with its sampling settings, checked against the model."""
        body.check_fields()
        structured = body.structured_output()
        schema = None
        if structured is not None:
            field, schema = structured
            if not engine.structured_outputs:
                raise RequestError(
                    field, f"the {engine.name} engine does not constrain its output, as {field} asks"
                )
            grammars.check_writable(schema, field)
        requests = []
        for field, prompt in build_prompts(body, tokenizer):
            params = sampling_params(body, tokenizer, len(prompt), engine.max_model_len, max_tokens, schema)
            check_context(prompt, params.max_tokens, engine.max_model_len, field, body.max_tokens_field())
            check_generate(
                prompt,
                params,
                vocab_size=engine.vocab_size,
                max_model_len=engine.max_model_len,
                max_samples=engine.max_samples,
                samples_field=body.samples_field(),
                prompt_field=field,
                sampling_field=_BODY,
            )
            requests.append((prompt, params))
        return requests

    def generator(body):
        """engine.generate, or where stop sequences of several tokens need the text to be
        watched, `_until_stopped` over the engine's stream."""
        stops = text_stop_strings(body, tokenizer)
        if not stops:
            return engine.generate
        return lambda prompt, params: _until_stopped(
            engine, tokenizer, prompt, params, stop_strings(body), body.min_tokens
        )

    async def respond(body, build_prompts, max_tokens: int | None, answer):
        """One generation endpoint: its prompts and checks, then `answer(body, requests,
        prompt_tokens)`: the stream or the whole body."""
        if body.model is not None and body.model != model_id:
            return JSONResponse(model_not_found(body.model, model_id), status_code=404)
        try:
            requests = checked(body, build_prompts, max_tokens)
        except RequestError as error:
            return _bad_request(error)
        try:
            return await answer(body, requests, sum(len(prompt) for prompt, _ in requests))
        except QueueFullError as error:
            return _queue_full(error)

    def generated(stream_format: _StreamFormat, full_body):
        """The answer of a request to generate: its stream, or `full_body` of its completions."""

        async def answer(body, requests, prompt_tokens: int):
            if body.stream:
                first, rest = await primed_streams(engine, requests)
                choices = len(requests) * body.n
                return _sse(
                    _stream_chunks(
                        stream_format, tokenizer, model_id, body, choices, prompt_tokens, first, rest
                    )
                )
            generate = generator(body)
            results = await all_or_nothing([generate(prompt, params) for prompt, params in requests])
            completions = [completion for result in results for completion in best_of_each(result, body.n)]
            return full_body(body, tokenizer, model_id, prompt_tokens, completions)

        return answer

    async def prompt_echo(prompt: list[int], top: int) -> Echo:
        """A prompt's own logprobs (temperature 1, as OpenAI's echo); its first token has none."""
        if len(prompt) == 1:
            return Echo(prompt, [None], [None] if top else None)
        score = await engine.score(prompt, 1, 1.0, top)
        return Echo(
            prompt,
            [None, *score.logprobs],
            None if score.top_logprobs is None else [None, *score.top_logprobs],
        )

    async def echoed(max_tokens: int, body: CompletionRequest, requests, prompt_tokens: int):
        """The answer of an `echo` request: each prompt before its completions, whole or
        streamed; max_tokens 0 generates nothing."""
        scoring = [prompt_echo(prompt, params.top_logprobs) for prompt, params in requests]
        if body.stream:
            # The prompts are scored before the streams open, so that nothing streams yet
            # when a prompt cannot be scored.
            echoes = await all_or_nothing(scoring)
            first, rest = await primed_streams(engine, requests) if max_tokens else (None, _no_deltas())
            choices = [echo for echo in echoes for _ in range(body.n)]
            return _sse(
                _stream_chunks(
                    _COMPLETION_STREAM,
                    tokenizer,
                    model_id,
                    body,
                    len(choices),
                    prompt_tokens,
                    first,
                    rest,
                    choices,
                )
            )
        generate = generator(body)
        generations = [generate(prompt, params) for prompt, params in requests] if max_tokens else []
        results = await all_or_nothing([*scoring, *generations])
        echoes, per_prompt = results[: len(requests)], results[len(requests) :]
        if not max_tokens:
            version = engine.policy_version
            per_prompt = [
                [Completion([], [], "length", version, version, [] if params.top_logprobs else None)] * body.n
                for _, params in requests
            ]
        choices = [echo for echo in echoes for _ in range(body.n)]
        completions = [completion for result in per_prompt for completion in best_of_each(result, body.n)]
        return completion_body(body, tokenizer, model_id, prompt_tokens, completions, choices)

    @app.post("/inference/v1/generate")
    async def generate_tokens(body: GenerateRequest, request: Request):
        return await _unless_the_client_leaves(request, _tokens_answer(tokens.generate(body)))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        return await _tokens_answer(asyncio.to_thread(tokens.tokenize, body))

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return await _tokens_answer(asyncio.to_thread(tokens.detokenize, body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _unless_the_client_leaves(request, complete(body))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await _unless_the_client_leaves(
            request, respond(body, chat_prompts, max_tokens, generated(_CHAT_STREAM, chat_body))
        )

    async def complete(body: CompletionRequest):
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        if not body.echo:
            answer = generated(_COMPLETION_STREAM, completion_body)
            return await respond(body, completion_prompts, max_tokens, answer)
        # max_tokens 0 asks for the prompt alone; the checks still want room for a token.
        return await respond(body, completion_prompts, max_tokens or 1, functools.partial(echoed, max_tokens))

    return app


def _completion_choice(
    tokenizer: Tokenizer, body: CompletionRequest, delta: StreamDelta, text: str, text_offset: int
) -> tuple[dict, int]:
    logprobs = None
    if body.logprobs is not None:
        logprobs = completion_logprobs(
            tokenizer, delta.token_ids, delta.logprobs, delta.top_logprobs, text_offset
        )
        text_offset += sum(len(token) for token in logprobs["tokens"])
    entry = {"index": delta.index, "text": text, "logprobs": logprobs, "finish_reason": delta.finish_reason}
    return entry, text_offset


def _chat_choice(
    tokenizer: Tokenizer, body: ChatCompletionRequest, delta: StreamDelta, text: str, text_offset: int
) -> tuple[dict, int]:
    logprobs = None
    if body.logprobs:
        logprobs = chat_logprobs(tokenizer, delta.token_ids, delta.logprobs, delta.top_logprobs)
    entry = {
        "index": delta.index,
        "delta": {"content": text} if text else {},
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
    }
    return entry, text_offset


@dataclass(frozen=True)
class _StreamFormat:
    """How one endpoint's server-sent chunks look."""

    object: str
    id_prefix: str
    choice: Callable[[Tokenizer, Any, StreamDelta, str, int], tuple[dict, int]]
    """A delta, the text it adds and where its tokens begin in the choice's text (completion
    logprobs' `text_offset`) -> its entry in a chunk's `choices`, and where the next delta's
    tokens begin."""
    opens_with_role: bool
    """Chat streams first announce each choice's role."""


_COMPLETION_STREAM = _StreamFormat("text_completion", "cmpl", _completion_choice, opens_with_role=False)
_CHAT_STREAM = _StreamFormat("chat.completion.chunk", "chatcmpl", _chat_choice, opens_with_role=True)


async def _no_deltas() -> AsyncIterator[list[StreamDelta]]:
    return
    yield


async def _until_stopped(
    engine: Engine,
    tokenizer: Tokenizer,
    prompt: list[int],
    params: GenerationParams,
    stops: list[str],
    min_tokens: int,
) -> list[Completion]:
    """The completions of a request whose samples end at a stop sequence the engine cannot
    see (several tokens long): its stream, watched as text, closed (so the request leaves the
    engine) once every sample has stopped or finished."""
    version_start = engine.policy_version
    samples = range(params.n)
    texts = [TextStream(tokenizer, stops, min_tokens) for _ in samples]
    token_ids: list[list[int]] = [[] for _ in samples]
    logprobs: list[list[float]] = [[] for _ in samples]
    tops = [[] if params.top_logprobs else None for _ in samples]
    reasons: list[str | None] = [None] * params.n
    stream = engine.stream(prompt, params)
    try:
        async for deltas in stream:
            for delta in deltas:
                i = delta.index
                if reasons[i] is not None:
                    continue
                token_ids[i] += delta.token_ids
                logprobs[i] += delta.logprobs
                if tops[i] is not None:
                    tops[i] += delta.top_logprobs
                texts[i].push(delta.token_ids)
                reasons[i] = "stop" if texts[i].stopped else delta.finish_reason
            if None not in reasons:
                break
    finally:
        await stream.aclose()
    version = engine.policy_version
    return [
        Completion(token_ids[i], logprobs[i], reasons[i] or "abort", version_start, version, tops[i])
        for i in samples
    ]


class _StreamedCalls:
    """One chat choice's text as it streams, split into content and tool calls."""

    def __init__(self, limit: int | None):
        self.stream = ToolCallStream(limit)
        self.made = 0

    def push(self, text: str, ended: bool) -> tuple[str, list[dict]]:
        """The content settled by `text` (all of it once `ended`) and the calls it completed,
        as a delta's `tool_calls`."""
        items = self.stream.push(text) + (self.stream.finish() if ended else [])
        calls = [item for item in items if isinstance(item, ToolCall)]
        made = [call.to_openai(index=self.made + k) for k, call in enumerate(calls)]
        self.made += len(made)
        return "".join(item for item in items if isinstance(item, str)), made


class _ForcedCalls:
    """One chat choice's text as it streams, constrained to tool calls: held back until it
    ends, then sent as calls (`forced_tool_calls`)."""

    def __init__(self, name: str | None):
        self.name = name
        self.text = ""
        self.made = 0

    def push(self, text: str, ended: bool) -> tuple[str, list[dict]]:
        self.text += text
        if not ended:
            return "", []
        content, calls = forced_tool_calls(self.text, self.name)
        self.made = len(calls)
        return content or "", [call.to_openai(index=k) for k, call in enumerate(calls)]


async def _stream_chunks(  # noqa: C901 - one branch per stream event kind
    form: _StreamFormat,
    tokenizer: Tokenizer,
    model_id: str,
    body: CompletionRequest | ChatCompletionRequest,
    choices: int,
    prompt_tokens: int,
    first: list[StreamDelta] | None,
    rest: AsyncIterator[list[StreamDelta]],
    echoes: Sequence[Echo] | None = None,
) -> AsyncIterator[dict]:
    """`first`: the first deltas (None: nothing is generated); `echoes`: with `echo`, each
    choice's prompt, sent as its first chunk."""
    texts = [TextStream(tokenizer, stop_strings(body), body.min_tokens) for _ in range(choices)]
    calls = None
    mode = body.tool_mode() if isinstance(body, ChatCompletionRequest) else "none"
    if mode == "auto":
        calls = [_StreamedCalls(body.tool_call_limit()) for _ in range(choices)]
    elif mode != "none":
        calls = [_ForcedCalls(body.forced_name()) for _ in range(choices)]
    ended = [False] * choices
    offsets = [0] * choices
    ident, created = new_id(form.id_prefix), now()

    def chunk(entries: list[dict], **extra) -> dict:
        return {
            "id": ident,
            "object": form.object,
            "created": created,
            "model": model_id,
            "choices": entries,
            **extra,
        }

    if form.opens_with_role:
        role = {"role": "assistant", "content": ""}
        yield chunk(
            [{"index": i, "delta": role, "logprobs": None, "finish_reason": None} for i in range(choices)]
        )

    def entry(delta: StreamDelta, piece: str) -> dict:
        choice, offsets[delta.index] = form.choice(tokenizer, body, delta, piece, offsets[delta.index])
        return choice

    for index, echo in enumerate(echoes or ()):
        ended[index] = first is None
        prompt = StreamDelta(
            index, echo.token_ids, echo.logprobs, "length" if first is None else None, echo.top
        )
        yield chunk([entry(prompt, tokenizer.decode(echo.token_ids))])
    generated = 0
    batch = first
    try:
        while batch is not None:
            for delta in batch:
                text = texts[delta.index]
                if ended[delta.index]:  # stopped; the rest of its request is on its way out
                    continue
                generated += len(delta.token_ids)
                piece = text.push(delta.token_ids)
                reason = "stop" if text.stopped else delta.finish_reason
                if reason is not None:
                    piece += text.finish()
                    ended[delta.index] = True
                if calls is None:
                    yield chunk([entry(replace(delta, finish_reason=reason), piece)])
                    continue
                piece, made = calls[delta.index].push(piece, ended=reason is not None)
                if reason is not None and calls[delta.index].made:
                    reason = "tool_calls"
                choice = entry(replace(delta, finish_reason=reason), piece)
                if made:
                    choice["delta"]["tool_calls"] = made
                yield chunk([choice])
            if all(ended):
                break
            batch = await anext(rest, None)
    finally:
        await rest.aclose()  # every choice ended, or the client left: the request leaves the engine
    if body.stream_options is not None and body.stream_options.include_usage:
        yield chunk([], usage=usage(prompt_tokens, generated))
