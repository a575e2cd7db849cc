"""`rlrun check-config`'s checks beyond the schema (rlrun.checks): algorithms and their args,
files, env ids and args, devices; nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrun.checks import check_algorithms, check_run, used_algorithms
from rlrun.cli import main
from rlrun.common.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.toml"))


def config(*overrides: str):
    return load_config(REPO / "configs" / "reverse_text.toml", list(overrides))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_shipped_configs_pass(path):
    check_run(load_config(path, []))


def test_a_table_for_an_algorithm_the_run_does_not_use_is_named():
    run = config('orchestrator.algorithm_args.ema_per_member={"decay" = 0.9}')
    with pytest.raises(ConfigError, match=r"algorithm_args\.ema_per_member.*'ema_per_member', which the run"):
        check_algorithms(run.orchestrator)


def test_bad_args_of_a_builtin_algorithm_are_caught_before_anything_starts():
    run = config('orchestrator.algorithm_args.grpo={"std_normalise" = true}')
    with pytest.raises(ConfigError, match=r"orchestrator\.algorithm_args\.grpo.*std_normalise"):
        check_algorithms(run.orchestrator)


def test_the_warm_start_algorithm_counts_as_used_only_with_a_warm_start():
    run = config("orchestrator.warm_start.max_steps=0")
    assert "sft" not in used_algorithms(run.orchestrator)
    warm = config("orchestrator.warm_start.max_steps=2")
    assert used_algorithms(warm.orchestrator)[warm.orchestrator.warm_start.algorithm] == (
        "orchestrator.warm_start.algorithm"
    )


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        (
            'orchestrator.train.env.0.id="no-such-env"',
            r"orchestrator\.train\.env\.0\.id",
            "unknown environment",
        ),
        ('orchestrator.train.env.0.args={"colour" = 3}', r"env\.0\.args", "does not take these args"),
        (
            'orchestrator.train.env.0.id="alphabet-sort"\n',
            "orchestrator.algorithms",
            "owns no algorithms",
        ),
        ('model.config="no/such/model.json"', "model.config", "does not exist"),
        ('trainer.device="cuda:7"', "trainer.device", "does not exist"),
    ],
)
def test_what_can_be_checked_without_starting_anything(override, key, message):
    overrides = [override.strip()]
    if override.endswith("\n"):  # an env that owns no algorithms asked for one
        overrides += ['orchestrator.algorithms=["grpo", "mystery"]', "orchestrator.warm_start.max_steps=0"]
        overrides += ["orchestrator.train.env.0.args={}"]
    with pytest.raises(ConfigError, match=f"{key}.*{message}"):
        check_run(config(*overrides))


def test_check_config_exits_2_naming_the_key(capsys):
    path = str(REPO / "configs" / "reverse_text.toml")
    assert main(["check-config", path, "--set", "orchestrator.algorithm_args.echo={}"]) == 2
    assert "orchestrator.algorithm_args.echo" in capsys.readouterr().err
    assert main(["check-config", path, "--set", 'trainer.device="cuda:7"', "--no-devices"]) == 0
