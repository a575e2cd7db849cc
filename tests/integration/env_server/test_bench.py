"""`rlrun bench env-server --quick` runs end to end and ends with its JSON line."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import pytest
from env_test_servers import REPO

importlib.import_module("rlrun.inference.cli")


@pytest.mark.slow
def test_quick_bench_prints_the_overhead_per_rollout(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", RLRUN_BENCH_DIR=str(tmp_path / "bench"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrun.cli",
            "bench",
            "env-server",
            "--quick",
            "--output",
            str(tmp_path / "out.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "out.json").read_text()) == last
    assert math.isfinite(last["overhead_per_rollout_ms"])
    assert last["direct_step_ms"] > 0 and last["env_server_step_ms"] > 0
    assert last["step_ratio_vs_direct"] == pytest.approx(last["env_server_step_ms"] / last["direct_step_ms"])
