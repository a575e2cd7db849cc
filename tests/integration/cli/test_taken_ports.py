"""A taken port: every service exits at once, non-zero, with one line that names the port and
the option or key that sets it, and no traceback; `rlrun local` finds a taken port its run
file sets before it starts anything. Real processes through the console script, against a
port a real socket holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "reverse_text.toml"
RLRUN = Path(sys.executable).with_name("rlrun")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
NEVER_HANG_S = 300
"""A service that hangs fails the test here instead of hanging the suite."""


@pytest.fixture
def taken() -> Iterator[int]:
    """A port a listening socket holds for the test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def rlrun(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(RLRUN), *argv], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=NEVER_HANG_S
    )


def serve(service: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    return rlrun("serve", service, "--config", str(CONFIG), "--log-dir", str(tmp_path), *options)


def said(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("service", ["inference", "env-server", "orchestrator", "trainer"])
def test_a_service_whose_grpc_port_is_taken_exits_at_once_naming_it(tmp_path, taken, service):
    result = serve(service, tmp_path, "--port", str(taken))
    assert result.returncode == 1
    assert said(result) == (
        f"rlrun serve {service}: cannot bind the gRPC server to 127.0.0.1:{taken} (--port): address "
        f"already in use; stop what holds it (`ss -ltnp 'sport = :{taken}'` names it) or choose another "
        "port with --port"
    )
    assert result.stdout == ""  # no ready line


def test_a_taken_metrics_port_is_named(tmp_path, taken):
    result = serve("orchestrator", tmp_path, "--metrics-port", str(taken))
    assert result.returncode == 1
    assert said(result).startswith(
        f"rlrun serve orchestrator: cannot bind the metrics endpoint to 127.0.0.1:{taken} (--metrics-port): "
        "address already in use"
    )


@pytest.mark.parametrize("how", ["--http-port", "inference.http_port"])
def test_a_taken_http_port_is_named_by_what_set_it(tmp_path, taken, how):
    option = ["--http-port", str(taken)] if how == "--http-port" else ["--set", f"{how}={taken}"]
    result = serve("inference", tmp_path, *option)
    assert result.returncode == 1
    assert said(result).startswith(
        f"rlrun serve inference: cannot bind the OpenAI-compatible HTTP API to 127.0.0.1:{taken} ({how}): "
        "address already in use"
    )


def test_rlrun_local_names_a_taken_port_and_its_key_before_starting_anything(tmp_path, taken):
    out = tmp_path / "run"
    result = rlrun("local", str(CONFIG), "--output-dir", str(out), "--set", f"inference.http_port={taken}")
    assert result.returncode == 2
    assert said(result).startswith(
        f"rlrun local: invalid config: inference.http_port: port {taken} on 127.0.0.1 is taken "
        "(address already in use)"
    )
    assert not out.exists()
