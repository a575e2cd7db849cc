"""Helpers of the sandbox tests: processes found by a marker in their command line, and a folder
for sandboxes that their unprivileged user may enter (pytest's tmp_path is private to root)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (the calling process excepted)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


async def gone(marker: str, polls: int = 2400) -> bool:
    """Whether every process with `marker` has ended (killed processes take a moment to be reaped)."""
    for _ in range(polls):
        if not processes_with(marker):
            return True
        await asyncio.sleep(0.025)
    return False


async def started(marker: str, count: int = 1, polls: int = 2400) -> bool:
    """Whether `count` processes with `marker` are running (waiting a while for them)."""
    for _ in range(polls):
        if len(processes_with(marker)) >= count:
            return True
        await asyncio.sleep(0.025)
    return False


@contextmanager
def sandbox_base() -> Iterator[Path]:
    folder = Path(tempfile.gettempdir()) / "rlrun-sandbox-tests" / secrets.token_hex(6)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
