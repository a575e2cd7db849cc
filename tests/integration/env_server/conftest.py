"""Fixtures for env-server integration tests: a scripted inference service, the built-in
env-server (`rlrun serve env-server` as a subprocess) and the external example server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "support"))  # importable here and in spawned pool workers
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "support"))  # the shared test helpers

import env_test_support  # noqa: E402
from env_test_servers import BUILTIN_ENVS, REPO, Server, serve_builtin, serve_external  # noqa: E402

from rlrun.common.tokenizer import CharTokenizer, load_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer() -> CharTokenizer:
    return load_tokenizer(REPO / "configs/tokenizer/char")


@pytest.fixture(scope="session")
def inference_server(tokenizer) -> Iterator[env_test_support.RunningInference]:
    running = env_test_support.start_inference(tokenizer)
    yield running
    running.stop()


@pytest.fixture
def inference(inference_server) -> Iterator[env_test_support.ScriptedInference]:
    """The scripted inference servicer, reset for each test."""
    inference_server.servicer.reset()
    yield inference_server.servicer
    if inference_server.servicer.hold is not None:
        inference_server.servicer.hold.set()


@pytest.fixture(scope="session")
def builtin_server(tmp_path_factory) -> Iterator[Server]:
    # Generate waits out a replica answering UNAVAILABLE for grpc.unavailable_retry_s (120 s by
    # default, longer than a restart); a second here shows what comes after that wait.
    server = serve_builtin(
        tmp_path_factory.mktemp("builtin"), BUILTIN_ENVS, "[grpc]\nunavailable_retry_s = 1.0"
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def external_server() -> Iterator[Server]:
    server = serve_external()
    yield server
    server.stop()
