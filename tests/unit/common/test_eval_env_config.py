"""[[orchestrator.eval.env]] (issue 34 item 9): eval-only envs in the run file."""

from __future__ import annotations

import tomllib

import pytest

from rlrun.common.config import ConfigError, resolve_config
from rlrun.env_server.cli import select_entries

RUN = """
[orchestrator.eval]
interval = 5
num_tasks = 8
sampling = { max_completion_tokens = 6 }

[[orchestrator.train.env]]
id = "reverse-text"

[[orchestrator.eval.env]]
id = "arithmetic"
interval = 2
num_tasks = 3
sampling = { temperature = 0.5 }
args = { max_operand = 9 }

[[orchestrator.eval.env]]
id = "reverse-text"
name = "reverse-text-long"
args = { min_len = 9, max_len = 12 }
"""


def test_eval_envs_parse_with_their_own_settings():
    config, warnings = resolve_config(tomllib.loads(RUN))
    assert warnings == []
    first, second = config.orchestrator.eval.env
    assert (first.key, first.interval, first.num_tasks, first.sampling.temperature) == (
        "arithmetic",
        2,
        3,
        0.5,
    )
    assert (second.key, second.interval, second.num_tasks) == ("reverse-text-long", None, None)
    assert second.pool.type == "elastic"


def test_the_env_server_hosts_eval_entries_too():
    config, _ = resolve_config(tomllib.loads(RUN))
    assert [e.key for e in select_entries(config, [])] == ["reverse-text", "arithmetic", "reverse-text-long"]
    assert [e.key for e in select_entries(config, ["reverse-text-long"])] == ["reverse-text-long"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("ratio = 2.0", "`ratio` is about training"),
        ('algorithms = ["grpo"]', "`algorithms` is about training"),
        ("interval = -1", "interval"),
    ],
)
def test_training_keys_on_an_eval_env_are_refused(extra, message):
    text = "[[orchestrator.train.env]]\nid = 'x'\n[[orchestrator.eval.env]]\nid = 'y'\n" + extra
    with pytest.raises((ConfigError, ValueError), match=message):
        resolve_config(tomllib.loads(text))


def test_an_eval_env_needs_a_name_of_its_own():
    text = "[[orchestrator.train.env]]\nid = 'x'\n[[orchestrator.eval.env]]\nid = 'x'\n"
    with pytest.raises((ConfigError, ValueError), match="give an eval entry its own `name`"):
        resolve_config(tomllib.loads(text))
