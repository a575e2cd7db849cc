"""Each deprecated key of a run file is reported once by the real `rlrun` command, not twice
(the loader logged it and the CLI printed it again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
