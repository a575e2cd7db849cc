"""docs/environments.md, run as a reader runs it: every code block is taken from the Markdown,
the files it names are written into a fresh checkout, and its commands are run there with the
virtualenv's `rlrun` and `python` on PATH.

- Every block is a file (`title="..."`) or commands (`sh`), and every file is used.
- Every `rlrun` command's run file passes the checks the command runs before it starts (as
  `rlrun check-config`, with the command's own `--set`s): the envs are built from the guide's
  code, their prompts encoded, their algorithms and settings checked.
- The guide's first env trains for two steps, through the command as written plus a step
  limit (the default suite); every command runs as written, and the first env learns (slow).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from ..support.checkout import REPO, fresh_checkout, user_env

GUIDE = REPO / "docs" / "environments.md"
BLOCK = re.compile(r"^```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
TITLE = re.compile(r'title="(?P<title>[^"]+)"')


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, file name or None, text) of every fenced block, in order."""
    found = []
    for match in BLOCK.finditer(GUIDE.read_text()):
        title = TITLE.search(match["info"])
        found.append((match["lang"], title["title"] if title else None, match["body"]))
    return found


def files() -> dict[str, str]:
    return {title: body for _, title, body in blocks() if title}


def commands() -> list[str]:
    return [
        line
        for lang, title, body in blocks()
        if lang == "sh" and title is None
        for line in body.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def rlrun_commands(verb: str) -> list[list[str]]:
    """The argv of each `rlrun <verb>` command, after its environment assignments."""
    out = []
    for line in commands():
        words = shlex.split(line.split(">")[0])
        while words and "=" in words[0]:
            words.pop(0)
        if words[:2] == ["rlrun", verb]:
            out.append(words)
    return out


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = fresh_checkout(tmp_path / "checkout")
    for name, text in files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run(line: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout
    )


def test_every_block_is_a_file_or_commands_and_every_file_is_used():
    kinds = [(lang, title) for lang, title, _ in blocks()]
    assert all(title is not None or lang == "sh" for lang, title in kinds), kinds
    names = list(files())
    assert len(names) == len(set(names)), names
    used = "\n".join([*commands(), *(body for name, body in files().items() if name.endswith(".toml"))])
    for name in names:
        module = name.removesuffix("/__init__.py").removesuffix(".py")
        assert (name if not name.endswith(".py") else module) in used, f"{name} is used by nothing"
    assert rlrun_commands("local"), "the guide trains nothing"


def test_every_command_passes_the_checks_it_runs_before_starting(checkout):
    """What `rlrun local` checks first is what `rlrun check-config` checks: each command's run
    file with its own `--set`s."""
    for argv in rlrun_commands("local"):
        config = argv[2]
        sets = [argv[i + 1] for i, word in enumerate(argv) if word == "--set"]
        line = shlex.join(["rlrun", "check-config", config] + [a for s in sets for a in ("--set", s)])
        result = run(f"PYTHONPATH=. {line}", checkout, timeout=300)
        assert result.returncode == 0, (line, result.stderr)
        assert json.loads(result.stdout)["name"]


def test_the_first_env_trains_through_rlrun_local(checkout):
    """The guide's first `rlrun local` command, with two RL steps and a short warm start."""
    line = next(line for line in commands() if " rlrun local letters.toml" in f" {line}")
    short = " --max-steps 2 --set orchestrator.warm_start.max_steps=2 --set orchestrator.eval.num_tasks=16"
    result = run(line + short + " --no-progress", checkout, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["phase"] == "succeeded" and summary["steps"] == 2
    rows = [json.loads(r) for r in (checkout / "outputs/letters/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2]
    assert all("env/letters-LetterShift/reward_mean" in r for r in rows if r["phase"] == "rl")
    assert (checkout / "outputs/letters/logs/envs/train/letters-LetterShift.log").exists()


@pytest.mark.slow
def test_every_command_runs_as_written_and_the_first_env_learns(checkout):
    for line in commands():
        result = run(line, checkout, timeout=1800)
        assert result.returncode == 0, (line, result.stderr[-3000:])
    summary = json.loads((checkout / "outputs/letters/local_summary.json").read_text())
    start, end = summary["eval_reward_start"], summary["eval_reward_end"]
    assert end - start >= 0.2 and end >= 0.8, summary
