"""What can go wrong inside a rollout, and how each failure becomes a TraceError.

Failures inside a rollout are data: the rollout still returns a trace, with `errors` set.
Infrastructure faults and invalid model output are retryable; programming errors are not.
"""

from __future__ import annotations

import asyncio

import grpc

from rlrun.common.wire.trace import TraceError
from rlrun.env_server.sdk.sandbox import SandboxError

RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
"""Status codes of a failed model call that a retry may cure."""


class ModelCallError(Exception):
    """A Generate call failed; `code` is the gRPC status name (e.g. UNAVAILABLE)."""

    def __init__(self, code: str, message: str, retryable: bool):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.retryable = retryable

    @classmethod
    def from_rpc(cls, error: grpc.aio.AioRpcError, address: str) -> ModelCallError:
        code = error.code()
        return cls(code.name, f"Generate on {address}: {error.details()}", code in RETRYABLE_CODES)


class InvalidModelOutput(Exception):
    """The model's answer breaks the token contract (or the env's output format, when an env
    decides such output should be retried rather than scored)."""


class PromptNotEncodable(ValueError):
    """A task's prompt holds characters the model's tokenizer cannot encode: it would turn them
    into its unknown token, and the model would be trained on a prompt nobody wrote. Not
    retryable: the task's text is the same every time."""


class ScoringError(Exception):
    """The env's scorer raised; the cause is chained."""


class ToolError(Exception):
    """A tool could not do what was asked (bad arguments, say). The harness shows the model
    the message as the tool's result; any other exception from a tool is a programming error."""


def trace_error(error: BaseException) -> TraceError:
    if isinstance(error, ModelCallError):
        return TraceError("ModelCallError", str(error), error.retryable)
    if isinstance(error, InvalidModelOutput):
        return TraceError("InvalidModelOutput", str(error), True)
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return TraceError("Timeout", str(error) or "timed out", True)
    if isinstance(error, SandboxError):
        return TraceError("SandboxError", str(error), True)
    if isinstance(error, PromptNotEncodable):
        return TraceError("PromptNotEncodable", str(error), False)
    if isinstance(error, ScoringError):
        cause = error.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(error)
        return TraceError("ScoringError", detail, False)
    return TraceError("HarnessError", f"{type(error).__name__}: {error}", False)
