"""Fixtures for the gRPC scaffolding tests: throw-away certificates and tiny test servicers."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rlrun.common.errors import RequestError, grpc_errors
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.v1 import inference_pb2, inference_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc

ORCHESTRATOR = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name
INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


class TestOrchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
    """GetStatus: sleeps `delay`, aborts UNAVAILABLE for the first `unavailable` calls, counts calls.
    Stop: raises a RequestError for reason "bad", a RuntimeError for reason "boom"."""

    __test__ = False

    def __init__(self, delay: float = 0.0, unavailable: int = 0) -> None:
        self.delay = delay
        self.unavailable = unavailable
        self.calls = 0
        self.started = asyncio.Event()

    async def GetStatus(self, request, context):
        self.calls += 1
        self.started.set()
        if self.calls <= self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if self.delay:
            await asyncio.sleep(self.delay)
        return orchestrator_pb2.GetRunStatusResponse(step=self.calls)

    @grpc_errors
    async def Stop(self, request, context):
        if request.reason == "bad":
            raise RequestError("reason", "must not be 'bad'")
        if request.reason == "boom":
            raise RuntimeError("kaboom")
        return orchestrator_pb2.StopResponse(phase=orchestrator_pb2.RUN_PHASE_STOPPING)


class TestInference(inference_pb2_grpc.InferenceServiceServicer):
    """UpdateWeights (client stream): counts chunk bytes, then sleeps `delay`."""

    __test__ = False

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def UpdateWeights(self, request_iterator, context):
        received = 0
        async for message in request_iterator:
            received += len(message.chunk.data)
        if self.delay:
            await asyncio.sleep(self.delay)
        return inference_pb2.UpdateWeightsResponse(version=1, bytes_received=received)


@dataclass
class Running:
    server: GrpcServer
    orchestrator: TestOrchestrator
    inference: TestInference

    @property
    def address(self) -> str:
        return self.server.address


async def start_test_server(options: ServerOptions | None = None, *, serving: bool = True, **kw) -> Running:
    options = options or ServerOptions()
    srv = GrpcServer(options, [ORCHESTRATOR, INFERENCE])
    orch = TestOrchestrator(**kw)
    inf = TestInference(delay=kw.get("delay", 0.0))
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(orch, srv.server)
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(inf, srv.server)
    await srv.start()
    if serving:
        srv.set_serving(True)
    return Running(srv, orch, inf)


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """Factory: `await start_server(options, serving=True, delay=0.0, unavailable=0)` starts a
    GrpcServer with the test servicers on 127.0.0.1; every server is stopped at teardown."""
    started: list[Running] = []

    async def start(*args, **kwargs) -> Running:
        run = await start_test_server(*args, **kwargs)
        started.append(run)
        return run

    yield start
    for run in started:
        await run.server.stop(0)


@pytest.fixture
async def running(start_server) -> Running:
    return await start_server()


# -- certificates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key, cert) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization

    key_path = path.with_suffix(".key")
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_path = path.with_suffix(".pem")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _ca(cn: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key, ca_cert, cn: str, *, server: bool):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("rlrun-test"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    importlib.import_module("cryptography")
    from cryptography.hazmat.primitives import serialization

    root = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _ca("rlrun test CA")
    ca_path = root / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = _write(root / "server", *_leaf(ca_key, ca_cert, "rlrun-test", server=True))
    client_cert, client_key = _write(root / "client", *_leaf(ca_key, ca_cert, "rlrun-client", server=False))
    _, other = _ca("some other CA")
    other_path = root / "other-ca.pem"
    other_path.write_bytes(other.public_bytes(serialization.Encoding.PEM))
    return Pki(ca_path, server_cert, server_key, client_cert, client_key, other_path)
