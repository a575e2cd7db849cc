"""A real `rlrun dashboard` process on 127.0.0.1, over run folders written by the orchestrator's
own writer (RunOutputs)."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rlrun.orchestrator.run.outputs import RunOutputs

REPO = Path(__file__).resolve().parents[3]
LISTENING = re.compile(r"rlrun dashboard: (http://\S+?)/? \(")


class Dashboard:
    def __init__(self, url: str, process: subprocess.Popen, output: list[str]):
        self.url = url
        self.process = process
        self.output = output
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port

    def request(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
        """One request with `path` sent exactly as given (no client-side normalisation of `..`)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in {"Host": f"127.0.0.1:{self.port}", **(headers or {})}.items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            reply = conn.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            conn.close()


@contextmanager
def dashboard_process(*args: str, env: dict | None = None):
    process = subprocess.Popen(
        [sys.executable, "-m", "rlrun.cli", "dashboard", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    ready = threading.Event()
    url: list[str] = []

    def read():
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if (m := LISTENING.search(line)) and not url:
                url.append(m[1])
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(60)
        assert url, "".join(output)
        yield Dashboard(url[0], process, output)
    finally:
        process.terminate()
        process.wait(20)


def write_run(folder: Path, name: str = "demo", steps: int = 3) -> RunOutputs:
    """A run folder as the orchestrator writes it: metrics lines, a trace file per RL step."""
    outputs = RunOutputs(folder)
    (folder / "resolved_config.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "resolved_config.json").write_text(
        f'{{"name": "{name}", "orchestrator": {{"max_steps": {steps}}}}}'
    )
    for step in range(1, steps + 1):
        outputs.append_metrics({"step": step, "trainer_step": step, "phase": "rl", "reward_mean": step / 10})
        outputs.write_traces(
            "rl", step, [{"phase": "rl", "step": step, "group_id": f"g{step}", "traces": []}]
        )
    return outputs


@pytest.fixture
def start_dashboard():
    """`with start_dashboard(*args, env=...) as dash`: a `rlrun dashboard` process."""
    return dashboard_process


@pytest.fixture
def make_run():
    return write_run


@pytest.fixture
def run_folder(tmp_path) -> Path:
    folder = tmp_path / "outputs" / "demo"
    write_run(folder)
    return folder
