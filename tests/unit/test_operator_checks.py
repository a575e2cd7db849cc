"""The operator's render runs the checks every entry point runs (rlrun.checks, Scope.cluster):
what the file alone says fails the RLRun at once, naming the key under spec.config; what only
the pods' own machines and images can say (files, devices, an env's import path) is left to
the pods, which check it when they start."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrun.common.config import ConfigError
from rlrun.operator.config import Cluster, render_config
from rlrun.operator.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
DEMO = (REPO / "configs" / "reverse_text.toml").read_text()
CLUSTER = Cluster("run", "ns", "cluster.local")


def render(config: str):
    return render_config(parse_spec({"config": config}), CLUSTER)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'id = "reverse-text"',
            'id = "revers-text"',
            "spec.config: orchestrator.train.env.0.id: unknown environment 'revers-text' "
            "(did you mean reverse-text?)",
        ),
        (
            "args = { min_len = 3, max_len = 8 }",
            "args = { min_len = 3, max_lenn = 8 }",
            "spec.config: orchestrator.train.env.0.args.max_lenn: env 'reverse-text' takes no argument "
            "'max_lenn' (did you mean max_len?)",
        ),
        (
            "[orchestrator.algorithm_args.grpo]",
            "[orchestrator.algorithm_args.gpro]",
            "spec.config: orchestrator.algorithm_args.gpro: a table for algorithm 'gpro', which the run "
            "does not use (did you mean grpo?)",
        ),
        (
            "batch_size = 64\ngroup_size",
            "batch_sise = 64\ngroup_size",
            "spec.config: orchestrator.batch_sise: unknown key (did you mean orchestrator.batch_size?)",
        ),
    ],
)
def test_a_mistake_in_the_file_fails_the_render_naming_the_key(old, new, expected):
    assert old in DEMO
    with pytest.raises(ConfigError) as error:
        render(DEMO.replace(old, new, 1))
    assert str(error.value).startswith(expected), str(error.value)


def test_what_only_the_pods_can_check_is_left_to_them():
    """A model file on the pods' volume, a GPU of theirs, an env in the env-server's image."""
    elsewhere = DEMO
    for old, new in (
        ('config = "configs/models/tiny-gpt2-d64.json"', 'config = "/data/models/mine.json"'),
        ("[trainer]\n", '[trainer]\ndevice = "cuda:3"\n'),
        ('id = "reverse-text"\nargs = { min_len = 3, max_len = 8 }', 'id = "my_envs.letters:LetterShift"'),
    ):
        assert old in elsewhere, old
        elsewhere = elsewhere.replace(old, new, 1)
    rendered = render(elsewhere)
    assert 'id = "my_envs.letters:LetterShift"' in rendered.toml


def test_a_context_group_that_does_not_divide_the_trainers_ranks_fails_the_render():
    config = DEMO.replace("[trainer]\n", "[trainer]\ncontext_parallel = 2\n", 1)
    assert "context_parallel" in config
    with pytest.raises(ConfigError) as error:
        render(config)
    assert str(error.value).startswith("spec.config: trainer.context_parallel: context groups of 2 ranks")
    assert "the trainer's 1 rank(s)" in error.value.message
    two_ranks = render_config(parse_spec({"config": config, "trainer": {"gpus_per_node": 2}}), CLUSTER)
    assert "context_parallel = 2" in two_ranks.toml
