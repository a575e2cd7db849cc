"""The `rlrun` command line: what each service's --help tells a user."""

import importlib

import pytest

from rlrun.cli import SERVICES, build_parser


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_serve_help_says_what_the_service_does_and_what_it_prints_when_ready(name, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", name, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    description = importlib.import_module(SERVICES[name]).DESCRIPTION
    assert description and " ".join(description.split()) in text
    assert f"`rlrun {name} listening on HOST:PORT`, then serves until SIGTERM" in text
