"""Dockerfiles/ read as instructions: what tests/unit/test_dockerfiles.py checks statically and
what the test cluster's node agent (tests/support/kubecluster/agent) runs an image's
ENTRYPOINT, CMD, ENV and WORKDIR from, since no image is built on this machine."""

from __future__ import annotations

import json
from pathlib import Path


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    if pending:
        raise ValueError(f"{path.name}: dangling line continuation")
    return result


def stages(path: Path) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(path):
        if keyword == "FROM":
            out.append([])
        if not out:
            raise ValueError(f"{path.name}: {keyword} before FROM")
        out[-1].append((keyword, rest))
    return out


def exec_form(rest: str) -> list[str]:
    """The JSON (exec) form of ENTRYPOINT/CMD; the shell form is refused."""
    try:
        value = json.loads(rest)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"not an exec-form list of strings: {rest}")
    return value
