"""Each deprecated key of a run file is reported once by the real `rlrun` command, not twice
(the loader logged it and the CLI printed it again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlrun.common.config.env import PoolConfig

REPO = Path(__file__).resolve().parents[3]


def old_spelling(tmp_path: Path) -> Path:
    text = (REPO / "configs/reverse_text.toml").read_text()
    old = text.replace("[orchestrator.train.sampling]", "[orchestrator.sampling]").replace(
        "max_completion_tokens", "max_tokens"
    )
    assert old != text
    path = tmp_path / "old.toml"
    path.write_text(old)
    return path


def rlrun(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_check_config_reports_each_deprecated_key_once(tmp_path):
    result = rlrun("check-config", str(old_spelling(tmp_path)), "--no-devices")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    for key in (
        "orchestrator.sampling is deprecated",
        "orchestrator.train.sampling.max_tokens is deprecated",
    ):
        assert sum(key in line for line in lines) == 1, result.stderr
    assert sum("deprecated" in line for line in lines) == 2, result.stderr


def test_a_served_service_reports_each_deprecated_key_once(tmp_path):
    """`rlrun serve` (as `rlrun local` starts every service) says it once too, on stderr; the
    run is refused after loading (an env key it does not have) so that nothing starts."""
    result = rlrun(
        "serve",
        "env-server",
        "--config",
        str(old_spelling(tmp_path)),
        "--set",
        f"output_dir={str(tmp_path)!r}",
        "--env",
        "no-such-env",
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert sum("orchestrator.sampling is deprecated" in line for line in lines) == 1, result.stderr
    assert sum("max_tokens is deprecated" in line for line in lines) == 1, result.stderr


def test_legacy_auto_workers_run_the_default_pool_with_one_warning(tmp_path):
    """`num_workers = "auto"` (the seeds' legacy value): the resolved config holds the default
    elastic pool, and the real command says so once."""
    text = (REPO / "configs/reverse_text.toml").read_text()
    legacy = text.replace('id = "reverse-text"\n', 'id = "reverse-text"\nnum_workers = "auto"\n')
    assert legacy != text
    path = tmp_path / "auto.toml"
    path.write_text(legacy)
    result = rlrun("check-config", str(path), "--no-devices")
    assert result.returncode == 0, result.stderr
    assert sum("deprecated" in line for line in result.stderr.splitlines()) == 1, result.stderr
    assert 'orchestrator.train.env.0.num_workers = "auto" is deprecated' in result.stderr
    pool = json.loads(result.stdout)["orchestrator"]["train"]["env"][0]["pool"]
    assert pool == PoolConfig().model_dump() and pool["type"] == "elastic"
