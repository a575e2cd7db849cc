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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "trainer", "--config", "c.toml", "--port", "99999"], "--port: 99999 is not a port"),
        (["serve", "orchestrator", "--config", "c.toml", "--metrics-port", "-1"], "-1 is not a port"),
        (
            ["serve", "inference", "--config", "c.toml", "--http-port", "x"],
            "--http-port: 'x' is not an integer",
        ),
        (["serve", "inference", "--config", "c.toml", "--require-version", "-1"], "-1 is negative"),
        (["operator", "--liveness-port", "65536"], "--liveness-port: 65536 is not a port"),
    ],
)
def test_a_bad_number_is_a_usage_error_naming_the_option(argv, message, capsys):
    # gRPC would otherwise wrap port 99999 round to 34463 and serve there.
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_ports_and_versions_in_range_are_taken():
    args = build_parser().parse_args(
        [
            "serve",
            "inference",
            "--config",
            "c.toml",
            "--port",
            "65535",
            "--http-port",
            "0",
            "--require-version",
            "0",
        ]
    )
    assert (args.port, args.http_port, args.require_version) == (65535, 0, 0)
