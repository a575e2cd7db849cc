"""A process and its descendants as /proc shows them (Linux): their resident memory and CPU
time, read from outside, as an operator's tools see a service."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts: signalling it is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (read from each thread's `children`)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            with contextlib.suppress(FileNotFoundError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_rss(pid: int) -> int:
    """Resident memory of `pid` and its descendants, summed."""
    return sum(rss_bytes(p) for p in descendants(pid))
