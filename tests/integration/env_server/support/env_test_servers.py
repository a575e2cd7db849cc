"""Test-only helpers that start env-servers as subprocesses: the built-in one through
`rlrun serve env-server`, and the external example."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from rlrun.v1 import env_pb2_grpc

SUPPORT = Path(__file__).parent
REPO = Path(__file__).resolve().parents[4]
READY = re.compile(r"listening on (?P<address>\S+:\d+)$")


@dataclass
class Server:
    name: str
    process: subprocess.Popen
    address: str
    channel: grpc.Channel
    log_dir: Path | None = None

    @property
    def stub(self) -> env_pb2_grpc.EnvServiceStub:
        return env_pb2_grpc.EnvServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def start_server(name: str, argv: list[str], log_dir: Path | None = None, timeout_s: float = 120.0) -> Server:
    process = subprocess.Popen(
        argv,
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        stdin=subprocess.DEVNULL,
    )
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.2):
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {process.returncode} before it was ready")
                continue
            line = process.stdout.readline()
            if not line:
                process.wait(timeout=10)
                raise RuntimeError(f"{name} exited with code {process.returncode} before it was ready")
            match = READY.search(line.strip())
            if match:
                address = match["address"]
                channel = grpc.insecure_channel(address)
                grpc.channel_ready_future(channel).result(timeout=30)
                return Server(name, process, address, channel, log_dir)
        raise RuntimeError(f"{name} printed no ready line within {timeout_s} s")
    except BaseException:
        process.kill()
        process.wait()
        raise
    finally:
        selector.close()


def write_config(path: Path, envs: str, extra: str = "") -> Path:
    path.write_text(f"""
name = "env-server-test"
output_dir = "{path.parent / "out"}"
[model]
max_model_len = 64
[orchestrator]
rollout_timeout_s = 60
[orchestrator.train.sampling]
temperature = 1.0
max_completion_tokens = 12
{extra}
{envs}
""")
    return path


def serve_builtin(tmp: Path, envs: str, extra: str = "") -> Server:
    config = write_config(tmp / "run.toml", envs, extra)
    log_dir = tmp / "logs"
    argv = [
        sys.executable,
        "-m",
        "rlrun.cli",
        "serve",
        "env-server",
        "--config",
        str(config),
        "--log-dir",
        str(log_dir),
    ]
    return start_server("built-in env-server", argv, log_dir)


def serve_external() -> Server:
    argv = [sys.executable, str(REPO / "examples/external_env/server.py"), "--port", "0"]
    return start_server("external env-server", argv)


BUILTIN_ENVS = """
[[orchestrator.train.env]]
id = "reverse-text"
[[orchestrator.train.env]]
id = "tool-calc"
[[orchestrator.train.env]]
id = "alphabet-sort"
name = "alphabet-sort-multi"
args = { max_turns = 3 }
[[orchestrator.train.env]]
id = "alphabet-sort"
name = "alphabet-sort-rewrite"
args = { max_turns = 3, rewrite_history = true }
[[orchestrator.train.env]]
id = "arithmetic"
sampling = { temperature = 0.7 }
[[orchestrator.train.env]]
id = "env_test_support:BrokenHarnessEnv"
name = "broken"
[[orchestrator.train.env]]
id = "env_test_support:NoReferenceEnv"
name = "no-reference"
[[orchestrator.train.env]]
id = "env_test_support:RankedEnv"
name = "ranked"
[[orchestrator.train.env]]
id = "reverse-text"
name = "external-entry"
address = "127.0.0.1:1"
"""
"""Every built-in env plus test envs; the last entry has an address, so it is not hosted."""
