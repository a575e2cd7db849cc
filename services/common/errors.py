"""Error mapping at the gRPC service boundary.

A malformed request gets INVALID_ARGUMENT with a message that names the offending field and
never crashes a server (DESIGN.md section 3). Servicers raise `RequestError(field, message)`
for bad input and decorate their methods with `@grpc_errors`:

    class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
        @grpc_errors
        async def Generate(self, request, context):
            if not request.token_ids:
                raise RequestError("token_ids", "must not be empty")
            ...

Mapping done by `grpc_errors`:

- `RequestError` and pydantic `ValidationError` -> INVALID_ARGUMENT, message names the field.
- `NotImplementedError` -> UNIMPLEMENTED.
- A failed downstream call (`grpc.aio.AioRpcError`) whose code is UNAVAILABLE, DEADLINE_EXCEEDED
  or RESOURCE_EXHAUSTED keeps that code (an infrastructure fault the caller may retry); any
  other downstream code becomes INTERNAL.
- Anything else (including a plain `ValueError`, which is most often a programming error) ->
  INTERNAL with the exception type and message, logged with its traceback.
- `context.abort(...)` raised inside the method, and cancellation, pass through untouched.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

__all__ = [
    "RequestError",
    "abort_invalid",
    "describe_validation_error",
    "did_you_mean",
    "grpc_errors",
    "nearest",
    "status_for_exception",
]

log = logging.getLogger("rlrun.common.errors")

# gRPC carries the status message in a header; keep it well under the default header limits.
MAX_DETAILS_CHARS = 2000

# Codes of a failed downstream call that are passed on unchanged (retryable infrastructure faults).
PASSTHROUGH_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

F = TypeVar("F", bound=Callable[..., Any])


class RequestError(ValueError):
    """Invalid input at a service boundary. `field` names the offending field
    (a dotted path such as `samples[3].mask`); str() is `"<field>: <message>"`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # keep picklable (multiprocessing pools) despite the two-arg __init__
        return (type(self), (self.field, self.message))


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word` (a misspelling of it), or None when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """` (did you mean <prefix><nearest>?)`, or "" when no choice is close to `word`."""
    match = nearest(word, choices)
    return f" (did you mean {prefix}{match}?)" if match is not None else ""


def _model_in(annotation: Any) -> Any:
    """The pydantic model (or container of one) an annotation holds: `X | None` -> X."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members[0] if len(members) == 1 else None
    return annotation


def keys_at(model: Any, loc: Sequence[str | int]) -> list[str] | None:
    """The keys the table at `loc` (a pydantic error location below `model`) may hold, or
    None when `loc` does not lead to a pydantic model."""
    annotation = model
    for part in loc:
        annotation = _model_in(annotation)
        origin = typing.get_origin(annotation)
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return None
            annotation = field.annotation
        elif origin in (list, tuple, dict) and isinstance(part, int) == (origin is not dict):
            annotation = typing.get_args(annotation)[-1 if origin is dict else 0]
        else:
            return None
    annotation = _model_in(annotation)
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return list(annotation.model_fields)
    return None


def describe_error_item(item: dict[str, Any], model: Any = None, prefix: str = "") -> tuple[str, str]:
    """(key path, message) of one pydantic error; an unknown key's message names the nearest
    valid key of its table when `model` (the validated class) is given."""
    loc = tuple(item.get("loc", ()))
    path = prefix + ".".join(str(p) for p in loc)
    message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
    if item.get("type") == "extra_forbidden" and loc:
        keys = keys_at(model, loc[:-1]) if model is not None else None
        message = "unknown key"
        if keys is not None:
            table = prefix + "".join(f"{p}." for p in loc[:-1])
            message += did_you_mean(str(loc[-1]), keys, table) or f" (valid keys: {', '.join(keys)})"
    return path or "<root>", message


def describe_validation_error(error: Exception, model: Any = None) -> str:
    """One-line description of a pydantic ValidationError naming every failing field (and for
    an unknown key, with `model` the validated class, the nearest valid one)."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    parts = [": ".join(describe_error_item(item, model)) for item in errors()]
    return "; ".join(parts) or str(error)


def _truncate(text: str) -> str:
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return text[: MAX_DETAILS_CHARS - 3] + "..."


def _is_validation_error(error: BaseException) -> bool:
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a project dependency
        return False
    return isinstance(error, ValidationError)


def status_for_exception(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message `grpc_errors` sends for `error`."""
    if isinstance(error, RequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if _is_validation_error(error):
        return grpc.StatusCode.INVALID_ARGUMENT, describe_validation_error(error)
    if isinstance(error, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED, f"not implemented: {error}" if str(error) else "not implemented"
    if isinstance(error, grpc.aio.AioRpcError):
        code = error.code()
        message = f"downstream call failed: {code.name}: {error.details()}"
        if code in PASSTHROUGH_CODES:
            return code, message
        return grpc.StatusCode.INTERNAL, message
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


async def abort_invalid(context: grpc.aio.ServicerContext, error: Exception) -> None:
    """Aborts the call with INVALID_ARGUMENT and str(error). Raises (as context.abort does)."""
    message = describe_validation_error(error) if _is_validation_error(error) else str(error)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _truncate(message))


async def _abort_for(error: Exception, context: grpc.aio.ServicerContext, name: str) -> None:
    code, message = status_for_exception(error)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        log.info("%s: invalid request: %s", name, message)
    elif code in PASSTHROUGH_CODES:
        log.warning("%s: %s", name, message)
    else:
        log.error("%s failed: %s", name, message, exc_info=error)
    await context.abort(code, _truncate(message))


def _passes_through(error: BaseException) -> bool:
    # context.abort raises grpc.aio.AbortError; it must reach the framework untouched.
    return isinstance(error, grpc.aio.AbortError)


def grpc_errors(func: F) -> F:
    """Decorator for async servicer methods (coroutines or async generators); see module doc."""
    name = getattr(func, "__qualname__", repr(func))

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def stream_wrapper(self, request, context, *args, **kwargs):
            try:
                async for item in func(self, request, context, *args, **kwargs):
                    yield item
            except Exception as error:
                if _passes_through(error):
                    raise
                await _abort_for(error, context, name)

        return stream_wrapper  # type: ignore[return-value]

    if not inspect.iscoroutinefunction(func):
        raise TypeError(f"grpc_errors needs an async servicer method, got {name}")

    @functools.wraps(func)
    async def wrapper(self, request, context, *args, **kwargs):
        try:
            return await func(self, request, context, *args, **kwargs)
        except Exception as error:
            if _passes_through(error):
                raise
            await _abort_for(error, context, name)

    return wrapper  # type: ignore[return-value]
