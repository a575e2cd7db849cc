"""The one registry idiom (rlrun.common.registry): built-in entries, installed ones found
through their entry point group (a real distribution on sys.path), and import paths."""

from __future__ import annotations

import sys

import pytest

from rlrun.common.registry import Registry
from rlrun.env_server.sdk.environment import Environment


def install(site, name: str, group: str, entries: dict[str, str], module: str = "") -> None:
    """A distribution as pip leaves it: its module and its .dist-info with entry_points.txt."""
    if module:
        (site / f"{name}.py").write_text(module)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")


PLUGIN = """
from rlrun.env_server.envs.arithmetic import Arithmetic


class Sums(Arithmetic):
    pass


class NotAnEnv:
    pass
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_installed_entry_is_found_by_name_and_loaded_when_looked_up(site):
    install(site, "rlrun_test_sums", "rlrun.test_envs", {"sums": "rlrun_test_sums:Sums"}, PLUGIN)
    envs = Registry("environment", "rlrun.test_envs", Environment)
    envs.register_path("arithmetic", "rlrun.env_server.envs.arithmetic:Arithmetic")
    assert list(envs) == ["arithmetic", "sums"]  # built-in first; nothing imported yet
    assert "rlrun_test_sums" not in sys.modules
    assert envs["sums"].__name__ == "Sums" and issubclass(envs["sums"], Environment)
    assert envs.resolve("sums") is envs["sums"]
    assert envs.resolve("rlrun.env_server.envs.arithmetic:Arithmetic") is envs["arithmetic"]


def test_a_builtin_wins_over_an_installed_entry_of_its_name(site):
    install(site, "rlrun_test_dup", "rlrun.test_dup", {"arithmetic": "rlrun_test_sums:Sums"})
    envs = Registry("environment", "rlrun.test_dup", Environment)
    envs.register_path("arithmetic", "rlrun.env_server.envs.arithmetic:Arithmetic")
    assert envs["arithmetic"].__name__ == "Arithmetic"


def test_a_broken_installed_entry_fails_loudly_naming_it(site):
    install(
        site,
        "rlrun_test_broken",
        "rlrun.test_broken",
        {"missing": "rlrun_test_nothing:Env", "wrong": "rlrun_test_broken:NotAnEnv"},
        PLUGIN,
    )
    envs = Registry("environment", "rlrun.test_broken", Environment)
    with pytest.raises(
        RuntimeError, match=r"environment 'missing' of rlrun_test_nothing:Env .* does not load"
    ):
        envs["missing"]
    with pytest.raises(RuntimeError, match=r"'wrong' .* is not an Environment subclass"):
        envs["wrong"]


def test_names_and_import_paths_that_name_nothing_are_refused():
    knobs = Registry("sampling knob", "rlrun.test_none")
    knobs.register("a", object())
    with pytest.raises(ValueError, match=r"registered already"):
        knobs.register("a", object())
    with pytest.raises(ValueError, match=r"unknown sampling knob 'b'; built-in ids are \['a'\]"):
        knobs.resolve("b")
    with pytest.raises(ValueError, match=r"cannot import"):
        knobs.resolve("rlrun.nothing:here")
