"""A model named by its Hugging Face Hub id (model.hub_id), resolved by the real huggingface_hub
against a cache laid out here in the hub's own format (models--org--name/snapshots/<commit>/,
refs/main). Nothing may reach the Hub: HF_ENDPOINT points at a local socket that counts every
connection, and the tests that must stay offline assert it saw none. Each resolution runs in a
fresh interpreter, because huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlrun.common.config import ConfigError, ModelConfig

from ...support.hf_cache import COMMIT, HUB_ID, REPO, hub_env, lay_out_cache, trap_fixture  # noqa: F401

RESOLVE = """
import json, sys, tomllib
from rlrun.common.config import ConfigError, resolve_config
from rlrun.common.hub import resolve_hub_model
raw = tomllib.loads(open("configs/reverse_text.toml").read())
raw["model"] = json.loads(sys.argv[1])
try:
    config = resolve_hub_model(resolve_config(raw)[0])
except ConfigError as error:
    print(json.dumps({"error_path": error.path, "error": str(error)}))
else:
    print(json.dumps({"path": str(config.model.path), "revision": config.model.hub_revision}))
"""


def resolve(model: dict, env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", RESOLVE, json.dumps(model)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_cached_hub_model_resolves_offline_to_its_snapshot(tmp_path, trap):
    snapshot = lay_out_cache(tmp_path / "hf")
    out = resolve({"hub_id": HUB_ID}, hub_env(tmp_path / "hf", trap))
    assert out == {"path": str(snapshot), "revision": COMMIT}
    from rlrun.common.model import load_checkpoint_dir

    assert load_checkpoint_dir(out["path"]).config.vocab_size > 0
    assert trap.connections == 0


def test_a_pinned_commit_is_looked_up_in_the_cache_only(tmp_path, trap):
    """What `rlrun local` hands each service: the commit it resolved. Even without
    HF_HUB_OFFLINE, the lookup never calls the Hub."""
    snapshot = lay_out_cache(tmp_path / "hf")
    out = resolve({"hub_id": HUB_ID, "hub_revision": COMMIT}, hub_env(tmp_path / "hf", trap, offline=False))
    assert out["path"] == str(snapshot)
    assert trap.connections == 0


def test_a_model_missing_from_the_cache_offline_names_the_field(tmp_path, trap):
    lay_out_cache(tmp_path / "hf")
    out = resolve({"hub_id": "rlrun-test/absent"}, hub_env(tmp_path / "hf", trap))
    assert out["error_path"] == "model.hub_id"
    assert "'rlrun-test/absent' is not in the Hugging Face cache" in out["error"]
    assert "HF_HUB_OFFLINE is set" in out["error"] and str(tmp_path / "hf") in out["error"]
    assert trap.connections == 0


def test_an_unknown_commit_is_not_fetched(tmp_path, trap):
    lay_out_cache(tmp_path / "hf")
    out = resolve({"hub_id": HUB_ID, "hub_revision": "f" * 40}, hub_env(tmp_path / "hf", trap, offline=False))
    assert out["error_path"] == "model.hub_id" and "looked up in the cache only" in out["error"]
    assert trap.connections == 0


def test_online_the_hub_is_asked(tmp_path, trap):
    """The control for the trap: with HF_HUB_OFFLINE unset and a branch to resolve,
    huggingface_hub does call HF_ENDPOINT (here a socket that hangs up), and the error still
    names the field."""
    out = resolve({"hub_id": "rlrun-test/absent"}, hub_env(tmp_path / "hf", trap, offline=False))
    assert out["error_path"] == "model.hub_id"
    assert trap.connections > 0


def test_model_config_takes_one_source():
    with pytest.raises(ValueError, match="model.path .* or model.hub_id .*not both"):
        ModelConfig(path="some/dir", hub_id=HUB_ID)
    with pytest.raises(ValueError, match="model.hub_revision needs model.hub_id"):
        ModelConfig(hub_revision="main")
    with pytest.raises(ValueError, match="pattern"):
        ModelConfig(hub_id="not a/valid/id")
    model = ModelConfig(hub_id="Qwen/Qwen3-0.6B")
    assert model.tokenizer is None, "a Hub model brings its own tokenizer"


def test_the_cluster_names_hub_models_in_spec_model():
    from rlrun.operator.config import Cluster, render_config
    from rlrun.operator.spec import parse_spec

    demo = (REPO / "configs" / "reverse_text.toml").read_text()
    config = demo.replace('config = "configs/models/tiny-gpt2-d64.json"', 'hub_id = "Qwen/Qwen3-0.6B"')
    assert config != demo
    spec = parse_spec({"config": config})
    with pytest.raises(ConfigError) as error:
        render_config(spec, Cluster("run", "ns", "cluster.local"))
    assert error.value.path == "spec.config.model.hub_id"
    assert "spec.model.huggingFace.id" in error.value.message
