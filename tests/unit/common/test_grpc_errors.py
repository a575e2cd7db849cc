"""Error mapping at the service boundary (rlrun.common.errors), without a server."""

from __future__ import annotations

import pickle

import grpc
import grpc.aio
import pydantic
import pytest

from rlrun.common.errors import RequestError, abort_invalid, grpc_errors, status_for_exception


class Aborted(Exception):
    pass


class FakeContext:
    """Records context.abort and raises, like grpc.aio does."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code, details=""):
        self.aborted = (code, details)
        raise Aborted(details)


class Servicer:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    @grpc_errors
    async def Unary(self, request, context):
        if self.error is not None:
            raise self.error
        return request * 2

    @grpc_errors
    async def Stream(self, request, context):
        yield 1
        if self.error is not None:
            raise self.error
        yield 2


class Model(pydantic.BaseModel):
    temperature: float = pydantic.Field(gt=0)


def test_request_error_names_field():
    error = RequestError("samples[2].mask", "length 3 differs from token_ids (4)")
    assert isinstance(error, ValueError)
    assert error.field == "samples[2].mask"
    assert str(error) == "samples[2].mask: length 3 differs from token_ids (4)"
    clone = pickle.loads(pickle.dumps(error))
    assert clone.field == error.field and str(clone) == str(error)


def test_status_for_exception():
    assert status_for_exception(RequestError("reward", "NaN")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "reward: NaN",
    )
    with pytest.raises(pydantic.ValidationError) as err:
        Model(temperature=-1)
    code, message = status_for_exception(err.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("temperature:")
    code, message = status_for_exception(KeyError("x"))
    assert code == grpc.StatusCode.INTERNAL and message.startswith("KeyError")
    code, message = status_for_exception(ValueError("shape mismatch"))
    assert code == grpc.StatusCode.INTERNAL and message == "ValueError: shape mismatch"
    assert status_for_exception(NotImplementedError())[0] == grpc.StatusCode.UNIMPLEMENTED


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="downstream says no")


def test_downstream_errors():
    code, message = status_for_exception(_rpc_error(grpc.StatusCode.UNAVAILABLE))
    assert code == grpc.StatusCode.UNAVAILABLE and "downstream says no" in message
    code, _ = status_for_exception(_rpc_error(grpc.StatusCode.INVALID_ARGUMENT))
    assert code == grpc.StatusCode.INTERNAL  # our bad request downstream is our bug, not the caller's


async def test_decorator_unary():
    ctx = FakeContext()
    assert await Servicer().Unary(21, ctx) == 42
    assert ctx.aborted is None
    with pytest.raises(Aborted):
        await Servicer(RequestError("task.env", "unknown env 'nope'")).Unary(1, ctx)
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "task.env: unknown env 'nope'")
    with pytest.raises(Aborted):
        await Servicer(ZeroDivisionError("division by zero")).Unary(1, ctx)
    assert ctx.aborted == (grpc.StatusCode.INTERNAL, "ZeroDivisionError: division by zero")


async def test_decorator_lets_abort_through():
    ctx = FakeContext()
    abort = grpc.aio.AbortError("already aborted")
    with pytest.raises(grpc.aio.AbortError):
        await Servicer(abort).Unary(1, ctx)
    assert ctx.aborted is None


async def test_decorator_stream():
    ctx = FakeContext()
    assert [x async for x in Servicer().Stream(None, ctx)] == [1, 2]
    seen = []
    with pytest.raises(Aborted):
        async for x in Servicer(RequestError("n", "too big")).Stream(None, ctx):
            seen.append(x)
    assert seen == [1]
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "n: too big")


async def test_abort_invalid():
    ctx = FakeContext()
    with pytest.raises(Aborted):
        await abort_invalid(ctx, RequestError("x", "bad"))
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "x: bad")


def test_decorator_rejects_sync_methods():
    with pytest.raises(TypeError):

        @grpc_errors
        def Sync(self, request, context):  # noqa: N802
            return None
