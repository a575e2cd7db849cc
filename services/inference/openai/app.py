"""The HTTP routes of the OpenAI-compatible API over an engine: /v1/models, /v1/completions,
/v1/chat/completions (with `stream: true` as server-sent events) and /health (`serving`); and
vLLM's token-in/token-out API, /inference/v1/generate, /tokenize and /detokenize (`tito`).

Errors use OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a
bad request (the `param` names the field; code `context_length_exceeded` when it does not fit
the context), 404 `model_not_found` for a model not served here, 429 when the waiting queue is
full.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import Tokenizer
from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.plan import TokenizerInfo
from rlrun.inference.engines.base import Engine, QueueFullError
from rlrun.inference.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelNotFound,
    error_body,
    model_not_found,
)
from rlrun.inference.openai.request_params import BODY
from rlrun.inference.openai.serving import Answer, OpenAIServing
from rlrun.inference.openai.tito import DetokenizeRequest, GenerateRequest, TokenizeRequest, TokensServing
from rlrun.inference.openai.tool_parsers import AUTO, choose_parser
from rlrun.inference.text_path import TextPath


def build_openai_app(
    engine: Engine,
    tokenizer: Tokenizer,
    model_id: str,
    is_ready: Callable[[], bool],
    limits: RequestLimits,
    text: TextPath | None = None,
    tool_call_parser: str = AUTO,
) -> FastAPI:
    """`limits`: what one request may ask for; `text`: the gRPC text path the token-in/token-out
    routes share (one over `tokenizer` when not given); `tool_call_parser`: the format chat
    answers write tool calls in (`inference.tool_call_parser`; `auto` reads the tokenizer's chat
    template)."""
    app = FastAPI(title="rlrun inference", description="OpenAI-compatible API over the live policy.")
    parser = choose_parser(tool_call_parser, tokenizer.chat_template)
    serving = OpenAIServing(engine, tokenizer, model_id, limits, parser)
    if text is None:
        info = TokenizerInfo(vocab_size=tokenizer.vocab_size, stop_token_ids=list(tokenizer.stop_token_ids))
        text = TextPath(tokenizer, info)
    tokens = TokensServing(engine, text, model_id, limits)

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

    @app.get("/v1/models")
    async def models() -> dict:
        return serving.models()

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> Response:
        return await _answer(serving.model(model))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _unless_the_client_leaves(request, _answer(serving.completions(body)))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _unless_the_client_leaves(request, _answer(serving.chat(body)))

    @app.post("/inference/v1/generate")
    async def generate_tokens(body: GenerateRequest, request: Request) -> Response:
        return await _unless_the_client_leaves(request, _answer(tokens.generate(body)))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        return await _answer(asyncio.to_thread(tokens.tokenize, body))

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        return await _answer(asyncio.to_thread(tokens.detokenize, body))

    return app


async def _answer(work: Awaitable[Answer]) -> Response:
    """A body as JSON, a stream as server-sent events, or the error in OpenAI's shape."""
    try:
        answer = await work
    except RequestError as error:
        return _bad_request(error)
    except ModelNotFound as error:
        return JSONResponse(model_not_found(error.model, error.served), status_code=404)
    except QueueFullError as error:
        return JSONResponse(error_body(str(error), None, "rate_limit_error"), status_code=429)
    return JSONResponse(answer) if isinstance(answer, dict) else _sse(answer)


def _bad_request(error: RequestError) -> JSONResponse:
    param = error.field.removeprefix(f"{BODY}.")
    message = str(error.message).replace(f"{BODY}.", "")
    code = getattr(error, "code", None)
    return JSONResponse(error_body(message, param, code=code), status_code=400)


def _validation_message(error: dict, content_type: str) -> tuple[str, str | None]:
    """A validation error's message and the param it names, spelled as OpenAI does
    (`messages[0].role`); a body that is no JSON object is named as such."""
    loc = list(error.get("loc", ()))
    if loc[:1] == [BODY]:
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


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def lines():
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
            # A turn of the loop per chunk: with deltas queued, neither the engine's queue nor
            # an unpaused send suspends, so a batch of many choices (a chunk each) would hold
            # the loop until it is sent, and the health service and the disconnect watch wait.
            await asyncio.sleep(0)
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
