"""External env-servers through `rlrun local`: the shipped examples in Python
(examples/external_env, token level) and Node (examples/external_env_node, text level, no
tokenizer) each serve reverse-text on a free 127.0.0.1 port, the run file's env entry names
that address, and a short run (a warm start on the env's oracle, then RL) must raise the
reward. The Node test skips only when node or npm is not installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"
NODE_EXAMPLE = REPO / "examples" / "external_env_node"
RL_STEPS = 4


def run_file(tmp_path: Path, address: str) -> Path:
    """The demo's run file with its env entry pointing at `address` (and no `args`, which an
    external entry may not have)."""
    text = DEMO.read_text()
    entry = '[[orchestrator.train.env]]\nid = "reverse-text"\nargs = { min_len = 3, max_len = 8 }\n'
    assert entry in text
    path = tmp_path / "external.toml"
    path.write_text(
        text.replace(entry, f'[[orchestrator.train.env]]\nid = "reverse-text"\naddress = "{address}"\n')
    )
    return path


def rlrun_local(config: Path, out: Path, *sets: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """A short run: the warm start stops at 20 steps (or its target), checking the dev reward
    every 5; then RL_STEPS RL steps, evaluated at the start and the end."""
    overrides = [
        f"orchestrator.eval.interval={RL_STEPS}",
        "orchestrator.eval.num_tasks=64",
        "orchestrator.warm_start.max_steps=20",
        "orchestrator.warm_start.eval_interval=5",
        *sets,
    ]
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "local", str(config), "--output-dir", str(out)]
        + ["--max-steps", str(RL_STEPS), "--no-progress"]
        + [arg for s in overrides for arg in ("--set", s)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


class Server:
    """An external env-server process; its first stdout line names the address it listens on."""

    def __init__(self, argv: list[str], cwd: Path = REPO):
        self.process = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline()
        match = re.search(r"listening on (\S+:\d+)", line)
        assert match, f"no address in {line!r}; stderr: {self.process.stderr.read()}"
        self.address = match.group(1)

    def stop(self) -> str:
        self.process.terminate()
        _, stderr = self.process.communicate(timeout=30)
        return stderr


def assert_learned(result: subprocess.CompletedProcess, out: Path) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dev = [r["dev_reward"] for r in rows if r["phase"] == "dev"]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == list(range(1, RL_STEPS + 1))
    assert len(dev) >= 2 and dev[-1] > dev[0] + 0.1, dev  # the warm start on the env's oracle
    assert all(r["truncated_ratio"] < 0.5 for r in rl), rl  # replies end at the plan's end token
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["eval_reward_end"] > dev[0] + 0.1, summary


def test_the_python_example_trains_through_rlrun_local(tmp_path):
    server = Server(
        [sys.executable, "examples/external_env/server.py", "--tokenizer", "configs/tokenizer/lowercase"]
    )
    try:
        result = rlrun_local(run_file(tmp_path, server.address), tmp_path / "run")
    finally:
        stderr = server.stop()
    assert_learned(result, tmp_path / "run")
    assert "Traceback" not in stderr, stderr


def node_toolchain() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            f"the Node toolchain is not installed (node: {node}, npm: {npm}); `make setup` installs it"
        )
    return node, npm


def test_the_node_example_trains_through_rlrun_local_with_no_tokenizer(tmp_path):
    node, npm = node_toolchain()
    # `make setup` installs the example's packages; a fresh checkout gets them here.
    if not (NODE_EXAMPLE / "node_modules" / "@grpc" / "grpc-js").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_EXAMPLE, check=True, timeout=600)
    server = Server([node, "server.js", "--port", "0"], cwd=NODE_EXAMPLE)
    try:
        result = rlrun_local(run_file(tmp_path, server.address), tmp_path / "run")
    finally:
        stderr = server.stop()
    assert_learned(result, tmp_path / "run")
    assert "Error" not in stderr, stderr


def test_args_or_pool_on_an_external_env_entry_is_refused_naming_the_key(tmp_path):
    config = run_file(tmp_path, "127.0.0.1:1")
    for key, value in (("args", "{min_len = 2}"), ("pool", "{num_workers = 2}")):
        result = subprocess.run(
            [sys.executable, "-m", "rlrun.cli", "local", str(config), "--output-dir", str(tmp_path / "run")]
            + ["--set", f"orchestrator.train.env.0.{key}={value}"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert result.returncode == 2
        assert (
            f"rlrun local: invalid config: orchestrator.train.env.0.{key}: env 'reverse-text' is external"
            in (result.stderr)
        ), result.stderr
