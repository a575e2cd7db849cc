from __future__ import annotations

import argparse

import pytest

from rlrun.common.config import resolve_config
from rlrun.env_server.cli import add_arguments, select_entries


def config(*entries: dict):
    return resolve_config({"orchestrator": {"train": {"env": list(entries)}}})[0]


def test_by_default_every_entry_without_an_address_is_hosted():
    cfg = config(
        {"id": "reverse-text"}, {"id": "arithmetic", "address": "x:1"}, {"id": "tool-calc", "name": "tc"}
    )
    assert [e.key for e in select_entries(cfg, [])] == ["reverse-text", "tc"]


def test_named_entries_are_hosted_even_with_an_address():
    cfg = config({"id": "reverse-text"}, {"id": "arithmetic", "address": "x:1"})
    assert [e.key for e in select_entries(cfg, ["arithmetic", "arithmetic"])] == ["arithmetic"]


@pytest.mark.parametrize(
    ("names", "message"), [(["nope"], "'nope' names no"), ([], "every orchestrator.train.env")]
)
def test_bad_selections_are_errors(names, message):
    with pytest.raises(ValueError, match=message):
        select_entries(config({"id": "reverse-text", "address": "x:1"}), names)


def test_env_is_repeatable():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--env", "a", "--env", "b"]).env_names == ["a", "b"]
    assert parser.parse_args([]).env_names == []
