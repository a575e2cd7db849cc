"""`rlrun local` with the model named by a Hugging Face Hub id: the launcher resolves it once in
a cache laid out by the test (HF_HOME, the hub's models--org--name layout), every service loads
that snapshot, and nothing reaches the Hub (HF_HUB_OFFLINE=1, and HF_ENDPOINT points at a
socket that counts connections)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..support.hf_cache import COMMIT, HUB_ID, THREE_LAYERS, hub_env, lay_out_cache, trap_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"


def rlrun_local(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "local", str(DEMO), "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )


def test_rlrun_local_runs_a_hub_model_from_the_cache_offline(tmp_path, trap):
    # The demo's model.config has 2 layers; the Hub model 3 (model.config is ignored for it).
    snapshot = lay_out_cache(tmp_path / "hf", model_config=THREE_LAYERS)
    out = tmp_path / "run"
    result = rlrun_local(
        hub_env(tmp_path / "hf", trap),
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        "--set",
        f"model.hub_id={json.dumps(HUB_ID)}",
        "--set",
        "orchestrator.eval.interval=100",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["steps"] == 2
    resolved = json.loads((out / "resolved_config.json").read_text())["model"]
    assert resolved["path"] == str(snapshot) and resolved["hub_revision"] == COMMIT
    # The trainer built and checkpointed the Hub model (its 3 layers), not the demo's own.
    saved = sorted(out.glob("checkpoints/*/model/config.json"))
    assert saved and all(json.loads(p.read_text())["n_layer"] == 3 for p in saved), saved
    assert trap.connections == 0


def test_rlrun_local_names_the_field_when_the_hub_model_is_not_cached(tmp_path, trap):
    result = rlrun_local(
        hub_env(tmp_path / "hf", trap),
        "--output-dir",
        str(tmp_path / "run"),
        "--set",
        'model.hub_id="rlrun-test/absent"',
    )
    assert result.returncode == 2
    assert (
        "rlrun local: invalid config: model.hub_id: 'rlrun-test/absent' is not in the Hugging Face cache"
        in (result.stderr)
    )
    assert not (tmp_path / "run").exists(), "nothing started"
    assert trap.connections == 0
