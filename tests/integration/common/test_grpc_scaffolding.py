"""GrpcServer / open_channel on loopback: health, reflection, auth, TLS, deadlines, retries, errors."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rlrun.common.grpc_client import ClientOptions, open_channel, wait_for_health
from rlrun.common.grpc_server import ServerOptions
from rlrun.v1 import inference_pb2, inference_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc, weights_pb2

ORCHESTRATOR = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name
INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health(channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=2
    )
    return reply.status


async def get_status(channel, **kw):
    stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
    return await stub.GetStatus(orchestrator_pb2.GetRunStatusRequest(), **kw)


# -- health ------------------------------------------------------------------------------------


async def test_health_follows_set_serving(start_server):
    run = await start_server(serving=False)
    async with open_channel(run.address) as ch:
        assert await health(ch) == NOT_SERVING
        assert await health(ch, ORCHESTRATOR) == NOT_SERVING
        run.server.set_serving(True)
        assert await health(ch) == SERVING
        assert await health(ch, ORCHESTRATOR) == SERVING
        assert await health(ch, INFERENCE) == SERVING
        run.server.set_serving(False, ORCHESTRATOR)
        assert await health(ch, ORCHESTRATOR) == NOT_SERVING
        assert await health(ch, INFERENCE) == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health(ch, "no.such.Service")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_watch_streams_changes(running):
    async with open_channel(running.address) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        first = await stream.read()
        assert first.status == SERVING
        running.server.set_serving(False)
        second = await asyncio.wait_for(stream.read(), 2)
        assert second.status == NOT_SERVING
        stream.cancel()


async def test_wait_for_health(running):
    await wait_for_health(running.address, timeout_s=5)
    running.server.set_serving(False)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        await wait_for_health(running.address, timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert running.address in str(err.value) and "NOT_SERVING" in str(err.value)


async def test_wait_for_health_nothing_listening(start_server):
    run = await start_server()
    address = run.address
    await run.server.stop(0)
    with pytest.raises(TimeoutError) as err:
        await wait_for_health(address, timeout_s=0.5)
    assert address in str(err.value) and "UNAVAILABLE" in str(err.value)


async def test_stop_reports_not_serving_while_draining(start_server):
    run = await start_server(delay=1.0)
    async with open_channel(run.address) as ch:
        slow = asyncio.ensure_future(get_status(ch))
        await asyncio.wait_for(run.orchestrator.started.wait(), 2)
        t0 = time.monotonic()
        stopping = asyncio.ensure_future(run.server.stop(grace=3.0))
        await asyncio.sleep(0.1)
        assert not stopping.done()
        # The server is still up and tells probes it is going away.
        assert await health(ch) == NOT_SERVING
        assert await health(ch, ORCHESTRATOR) == NOT_SERVING
        run.server.set_serving(True)  # ignored once shutdown has begun
        assert await health(ch) == NOT_SERVING
        # The call in flight finishes within the grace, then the server goes.
        reply = await slow
        assert reply.step == 1
        await asyncio.wait_for(stopping, 3)
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health(ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_stop_cancels_calls_past_grace(start_server):
    run = await start_server(delay=10.0)
    async with open_channel(run.address) as ch:
        slow = asyncio.ensure_future(get_status(ch))
        await asyncio.wait_for(run.orchestrator.started.wait(), 2)
        t0 = time.monotonic()
        await run.server.stop(grace=0.3)
        assert time.monotonic() - t0 < 2
        with pytest.raises(grpc.aio.AioRpcError):
            await slow


# -- reflection ----------------------------------------------------------------------------------


async def test_reflection_lists_services(running):
    async with open_channel(running.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def requests():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = []
        async for reply in stub.ServerReflectionInfo(requests()):
            names = [s.name for s in reply.list_services_response.service]
    assert ORCHESTRATOR in names
    assert INFERENCE in names
    assert "grpc.health.v1.Health" in names


# -- auth ----------------------------------------------------------------------------------------


async def test_bearer_token_auth(start_server):
    run = await start_server(ServerOptions(auth_token="s3cret"))
    async with open_channel(run.address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "missing" in err.value.details()
        # health and reflection need no token
        assert await health(ch) == SERVING
    async with open_channel(run.address, ClientOptions(auth_token="wrong")) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await inference_pb2_grpc.InferenceServiceStub(ch).UpdateWeights(_chunks(2))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert run.orchestrator.calls == 0
    async with open_channel(run.address, ClientOptions(auth_token="s3cret")) as ch:
        assert (await get_status(ch)).step == 1
        reply = await inference_pb2_grpc.InferenceServiceStub(ch).UpdateWeights(_chunks(3))
        assert reply.bytes_received == 3 * 4
        await wait_for_health(run.address, ClientOptions(auth_token="s3cret"), timeout_s=2)


async def _chunks(n: int):
    for i in range(n):
        yield weights_pb2.WeightUpdateMessage(chunk=weights_pb2.WeightChunk(version=1, index=i, data=b"abcd"))


# -- TLS -------------------------------------------------------------------------------------------


async def test_tls(pki, start_server):
    run = await start_server(ServerOptions(tls_cert=pki.server_cert, tls_key=pki.server_key))
    async with open_channel(run.address, ClientOptions(tls_ca=pki.ca)) as ch:
        assert (await get_status(ch)).step == 1
    # host name checked against the certificate; server_name overrides it
    async with open_channel(f"localhost:{run.server.port}", ClientOptions(tls_ca=pki.ca)) as ch:
        assert (await get_status(ch)).step == 2
    async with open_channel(run.address, ClientOptions(tls_ca=pki.ca, server_name="rlrun-test")) as ch:
        assert (await get_status(ch)).step == 3
    # a client that trusts another CA does not get through
    async with open_channel(run.address, ClientOptions(tls_ca=pki.other_ca, retries=1)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch, timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # plaintext against a TLS server fails
    async with open_channel(run.address, ClientOptions(retries=1)) as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await get_status(ch, timeout=2)


async def test_mtls_requires_client_cert(pki, start_server):
    options = ServerOptions(
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_ca=pki.ca,
        require_client_cert=True,
        auth_token="t",
    )
    run = await start_server(options)
    good = ClientOptions(tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, auth_token="t")
    async with open_channel(run.address, good) as ch:
        assert (await get_status(ch)).step == 1
    await wait_for_health(run.address, good, timeout_s=2)
    async with open_channel(run.address, ClientOptions(tls_ca=pki.ca, auth_token="t", retries=1)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch, timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(TimeoutError):
        await wait_for_health(run.address, ClientOptions(tls_ca=pki.ca), timeout_s=0.5)
    assert run.orchestrator.calls == 1


# -- deadlines and retries ---------------------------------------------------------------------


async def test_default_deadline_applies_to_unary_and_streaming_calls(start_server):
    run = await start_server(delay=5.0)
    async with open_channel(run.address, ClientOptions(deadline_s=0.2)) as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 2
        # client stream
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await inference_pb2_grpc.InferenceServiceStub(ch).UpdateWeights(_chunks(1))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # server stream: Watch never ends on its own
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stream:
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 4
        # an explicit timeout wins over the default
        run.orchestrator.delay = 0.4
        assert (await get_status(ch, timeout=3)).step >= 1


async def test_retries_unavailable(start_server):
    run = await start_server(unavailable=1)
    async with open_channel(run.address, ClientOptions(retries=3)) as ch:
        reply = await get_status(ch)
    assert run.orchestrator.calls == 2
    assert reply.step == 2
    # retries=1: no retry, the caller sees UNAVAILABLE
    run.orchestrator.calls = 0
    async with open_channel(run.address, ClientOptions(retries=1)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_status(ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert run.orchestrator.calls == 1


# -- error mapping -------------------------------------------------------------------------------


async def test_grpc_errors_maps_exceptions(running):
    async with open_channel(running.address) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Stop(orchestrator_pb2.StopRequest(reason="bad"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("reason:")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Stop(orchestrator_pb2.StopRequest(reason="boom"))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "RuntimeError" in err.value.details() and "kaboom" in err.value.details()
        # the server is still fine
        reply = await stub.Stop(orchestrator_pb2.StopRequest(reason="ok"))
        assert reply.phase == orchestrator_pb2.RUN_PHASE_STOPPING
        assert await health(ch) == SERVING
