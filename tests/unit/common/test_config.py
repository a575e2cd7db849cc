"""Config: defaults, deprecated spellings (one warning each), conflicts, overrides, shipped configs."""

import copy
import json
import tomllib
from pathlib import Path

import pytest

from rlrun.cli import main as cli_main
from rlrun.common.config import ConfigError, RunConfig, load_config, load_config_with_warnings, resolve_config

REPO = Path(__file__).resolve().parents[3]
MINIMAL = {"orchestrator": {"train": {"env": [{"id": "reverse-text"}]}}}


def test_defaults_of_a_minimal_config():
    config, warnings = resolve_config(copy.deepcopy(MINIMAL))
    assert warnings == []
    assert config.model.config == Path("configs/models/tiny-d64.json")
    assert config.orchestrator.max_off_policy_steps == 1
    assert config.orchestrator.algorithms == ["grpo"]
    assert config.orchestrator.actor == "policy"
    assert config.orchestrator.train.sampling.max_completion_tokens == 16
    pool = config.orchestrator.train.env[0].pool
    assert (pool.type, pool.num_workers, pool.max_workers, pool.multiplex) == ("elastic", 1, 4, 128)
    assert config.inference.engine == "torch"
    assert config.trainer.loss.high == 0.2 and config.trainer.loss.kl_coef == 1e-3
    assert config.run_dir == Path("outputs/run")
    assert config.orchestrator.inflight_groups == 32
    assert config.model.tokenizer == Path("configs/tokenizer/char")


def test_a_checkpoint_brings_its_own_tokenizer_unless_one_is_named():
    """A config naming only `model.path` uses the checkpoint's tokenizer (a TOML file cannot
    unset a key, so that must be the default there)."""
    checkpoint = copy.deepcopy(MINIMAL) | {"model": {"path": "/models/qwen"}}
    config, _ = resolve_config(checkpoint)
    assert config.model.tokenizer is None
    checkpoint["model"]["tokenizer"] = "configs/tokenizer/char"
    assert resolve_config(checkpoint)[0].model.tokenizer == Path("configs/tokenizer/char")


def test_every_field_is_documented():
    def walk(model_cls, path):
        for name, field in model_cls.model_fields.items():
            assert field.description, f"{path}{name} has no docstring"
            assert (
                "Default" in field.description
                or field.is_required()
                or hasattr(field.annotation, "model_fields")
            ), f"{path}{name} does not state its default"
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{path}{name}.")

    walk(RunConfig, "")


OLD_STYLE = """
[orchestrator.sampling]
temperature = 0.5
max_tokens = 9

[[orchestrator.env]]
id = "reverse-text"
num_workers = 3
sampling = { max_tokens = 7 }
"""
NEW_STYLE = """
[orchestrator.train.sampling]
temperature = 0.5
max_completion_tokens = 9

[[orchestrator.train.env]]
id = "reverse-text"
pool = { type = "static", num_workers = 3 }
sampling = { max_completion_tokens = 7 }
"""


def test_deprecated_spellings_resolve_to_the_same_values_with_one_warning_each():
    old, warnings = resolve_config(tomllib.loads(OLD_STYLE))
    new, none = resolve_config(tomllib.loads(NEW_STYLE))
    assert old == new and none == []
    assert sorted(warnings) == sorted(
        [
            "orchestrator.sampling is deprecated; use orchestrator.train.sampling",
            "orchestrator.env is deprecated; use orchestrator.train.env",
            "orchestrator.train.sampling.max_tokens is deprecated; use orchestrator.train.sampling.max_completion_tokens",
            "orchestrator.train.env.0.sampling.max_tokens is deprecated; use orchestrator.train.env.0.sampling.max_completion_tokens",
            'orchestrator.train.env.0.num_workers is deprecated; use orchestrator.train.env.0.pool = {type = "static", num_workers = N}',
        ]
    )


def test_shipped_config_with_old_keys_matches_the_original(tmp_path):
    text = (REPO / "configs/reverse_text.toml").read_text()
    old = text.replace("[orchestrator.train.sampling]", "[orchestrator.sampling]").replace(
        "max_completion_tokens", "max_tokens"
    )
    path = tmp_path / "old.toml"
    path.write_text(old)
    config, warnings = load_config_with_warnings(path)
    assert config == load_config(REPO / "configs/reverse_text.toml")
    assert len(warnings) == 2
    assert any("orchestrator.sampling is deprecated" in w for w in warnings)
    assert any("max_tokens is deprecated" in w for w in warnings)


def test_num_workers_and_pool_together_the_pool_wins_with_a_warning():
    text = "[[orchestrator.train.env]]\nid='x'\nnum_workers=2\npool={type='static', num_workers=3}"
    config, warnings = resolve_config(tomllib.loads(text))
    assert config.orchestrator.train.env[0].pool.num_workers == 3
    assert warnings == [
        "orchestrator.train.env.0.num_workers is deprecated and ignored: orchestrator.train.env.0.pool is given and wins"
    ]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("[[orchestrator.train.env]]\nid='x'\nnum_workers='auto'", "orchestrator.train.env.0.num_workers"),
        (
            "[[orchestrator.train.env]]\nid='x'\npool={num_workers='auto'}",
            "orchestrator.train.env.0.pool.num_workers",
        ),
        ("[[orchestrator.env]]\nid='x'\nnum_workers='auto'", "orchestrator.train.env.0.num_workers"),
    ],
)
def test_legacy_auto_workers_are_refused_naming_the_key(text, path):
    with pytest.raises(ConfigError) as error:
        resolve_config(tomllib.loads(text))
    assert error.value.path == path
    assert 'num_workers = "auto"` is no longer supported' in str(error.value)
    assert path in str(error.value)


def test_an_elastic_pool_of_many_workers_raises_the_default_ceiling():
    text = "[[orchestrator.train.env]]\nid='x'\npool={num_workers=6}"
    pool = resolve_config(tomllib.loads(text))[0].orchestrator.train.env[0].pool
    assert (pool.type, pool.num_workers, pool.max_workers) == ("elastic", 6, 6)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "[orchestrator.sampling]\n[orchestrator.train.sampling]\n[[orchestrator.train.env]]\nid='x'",
            "orchestrator.sampling",
        ),
        (
            "[orchestrator.train.sampling]\nmax_tokens=3\nmax_completion_tokens=4\n[[orchestrator.train.env]]\nid='x'",
            "orchestrator.train.sampling.max_tokens",
        ),
        ("[[orchestrator.env]]\nid='x'\n[[orchestrator.train.env]]\nid='y'", "orchestrator.env"),
    ],
)
def test_old_and_new_spelling_together_is_an_error(text, path):
    with pytest.raises(ConfigError) as error:
        resolve_config(tomllib.loads(text))
    assert error.value.path == path


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"orchestrator": {"max_steps": 0}}, "orchestrator.max_steps"),
        ({"orchestrator": {"train": {"env": [{"id": "a", "ratio": -1}]}}}, "orchestrator.train.env.0.ratio"),
        ({"orchestrator": {"actor": "teacher"}}, "orchestrator"),
        ({"orchestrator": {"eval": {"pass_k": 4}}}, "orchestrator.eval"),
        ({"trainer": {"broadcast": {"transport": "ipc"}}, "inference": {"engine": "vllm"}}, ""),
        ({"trainer": {"lr": "fast"}}, "trainer.lr"),
        ({"trainer": {"lrr": 1}}, "trainer.lrr"),
        ({"inference": {"http_port": 65536}}, "inference.http_port"),
        ({"model": {"max_model_len": 8}}, ""),
        ({"orchestrator": {"members": [{"id": "a", "role": "fixed"}]}}, "orchestrator"),
        ({"orchestrator": {"members": [{"id": "a", "role": "train", "model": "judge"}]}}, "orchestrator"),
        ({"grpc": {"tls": {"cert": "c.pem"}}}, "grpc.tls"),
    ],
)
def test_incompatible_combinations_name_the_key(patch, path):
    raw = copy.deepcopy(MINIMAL)

    def merge(dst, src):
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v

    merge(raw, patch)
    with pytest.raises(ConfigError) as error:
        resolve_config(raw)
    assert error.value.path == path
    if path:
        assert str(error.value).startswith(f"{path}: ")


def test_cli_overrides():
    config, _ = resolve_config(
        copy.deepcopy(MINIMAL),
        [
            "orchestrator.train.sampling.temperature=0.7",
            'orchestrator.train.env.0.address="127.0.0.1:5000"',
            'inference.addresses=["a:1", "b:2"]',
            "name=plain-string",
        ],
    )
    assert config.orchestrator.train.sampling.temperature == 0.7
    assert config.orchestrator.train.env[0].address == "127.0.0.1:5000"
    assert config.inference.addresses == ["a:1", "b:2"]
    assert config.name == "plain-string"
    with pytest.raises(ConfigError, match="no list entry 3"):
        resolve_config(copy.deepcopy(MINIMAL), ["orchestrator.train.env.3.address=x"])
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        resolve_config(copy.deepcopy(MINIMAL), ["orchestrator.max_steps"])


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_parses(path):
    config, warnings = load_config_with_warnings(path)
    assert warnings == []
    assert config.model.config is None or (REPO / config.model.config).exists()


def test_check_config_prints_resolved_json(capsys):
    assert (
        cli_main(
            ["check-config", str(REPO / "configs/reverse_text.toml"), "--set", "orchestrator.max_steps=7"]
        )
        == 0
    )
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["orchestrator"]["max_steps"] == 7
    assert resolved["orchestrator"]["train"]["sampling"]["max_completion_tokens"] == 12


def test_check_config_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[orchestrator]\nmax_off_policy_steps = -1\n[[orchestrator.train.env]]\nid = 'reverse-text'\n"
    )
    assert cli_main(["check-config", str(bad)]) == 2
    assert "orchestrator.max_off_policy_steps" in capsys.readouterr().err
    assert cli_main(["check-config", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["orchestrator.batch_sise=3"],
            "orchestrator.batch_sise: unknown key (did you mean orchestrator.batch_size?)",
        ),
        (
            ["orchestrator.train.sampling.temprature=1.0"],
            "orchestrator.train.sampling.temprature: unknown key "
            "(did you mean orchestrator.train.sampling.temperature?)",
        ),
        (
            ['orchestrator.train.env.0.nmae="x"'],
            "orchestrator.train.env.0.nmae: unknown key (did you mean orchestrator.train.env.0.name?)",
        ),
        (
            ['orchestrator.eval.env=[{id = "reverse-text", name = "held", intervl = 3}]'],
            "orchestrator.eval.env.0.intervl: unknown key (did you mean orchestrator.eval.env.0.interval?)",
        ),
        (["trainr.lr=1e-3"], "trainr: unknown key (did you mean trainer?)"),
        (["trainer.zzz=1"], "trainer.zzz: unknown key (valid keys: address, device, "),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_one(overrides, expected):
    with pytest.raises(ConfigError) as error:
        resolve_config(copy.deepcopy(MINIMAL), overrides)
    assert str(error.value).startswith(expected), str(error.value)


def test_every_finding_of_the_schema_is_named():
    with pytest.raises(ConfigError) as error:
        resolve_config(copy.deepcopy(MINIMAL), ["orchestrator.batch_sise=3", "trainer.lr=-1"])
    message = str(error.value)
    assert message.startswith("trainer.lr: Input should be greater than 0 (and 1 more: ")
    assert "orchestrator.batch_sise: unknown key (did you mean orchestrator.batch_size?))" in message


@pytest.mark.parametrize(
    ("env_id", "key"),
    [
        ("reverse-text", "reverse-text"),
        ("letters.env:LetterShift", "letters.env-LetterShift"),
        ("vf:vf_reverse_text", "vf-vf_reverse_text"),
    ],
)
def test_an_env_entry_without_a_name_gets_a_file_safe_one(env_id, key):
    config, _ = resolve_config({"orchestrator": {"train": {"env": [{"id": env_id}]}}})
    assert config.orchestrator.train.env[0].key == key


@pytest.mark.parametrize("name", ["a:b", "my env", "../up", "-x"])
def test_an_env_name_that_is_not_file_safe_is_refused(name):
    with pytest.raises(ConfigError, match=r"orchestrator\.train\.env\.0\.name: .* is not a file-safe name"):
        resolve_config({"orchestrator": {"train": {"env": [{"id": "reverse-text", "name": name}]}}})
