"""A Hugging Face cache laid out as huggingface_hub leaves it, and a stand-in Hub that counts
connections (tests/unit/common/test_hub.py, tests/e2e/test_hub_model.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from rlrun.common.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = REPO / "configs" / "models" / "tiny-gpt2-d64.json"
THREE_LAYERS = REPO / "configs" / "models" / "tiny-gpt2-d64-l3.json"
"""The same model with 3 layers, not the demo's 2: what the services built shows which they loaded."""
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_ID = "rlrun-test/tiny-gpt2"


def lay_out_cache(
    hf_home: Path, repo_id: str = HUB_ID, commit: str = COMMIT, model_config: Path = MODEL_CONFIG
) -> Path:
    """A model in the Hugging Face cache as snapshot_download leaves it: the snapshot folder
    with config.json and real safetensors weights (a tiny model the project loads), and
    refs/main naming its commit."""
    from rlrun.common.model import build_model, save_checkpoint_dir

    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    model = build_model(ModelConfig(config=model_config, tokenizer=REPO / "configs/tokenizer/lowercase"))
    save_checkpoint_dir(model, json.loads(model_config.read_text()), snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


class HubTrap:
    """A TCP listener standing in for the Hub: counts connections and closes them."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self):
        self.server.close()


@pytest.fixture(name="trap")
def trap_fixture():
    hub = HubTrap()
    yield hub
    hub.close()


def hub_env(hf_home: Path, trap: HubTrap, offline: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_HOME=str(hf_home),
        HF_ENDPOINT=trap.endpoint,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_ETAG_TIMEOUT="2",
        HF_HUB_DOWNLOAD_TIMEOUT="2",
        OMP_NUM_THREADS="1",
    )
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env
