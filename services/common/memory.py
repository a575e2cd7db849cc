"""A process's memory after start-up and after bursts of work.

Python's cycle collector walks every tracked object of a generation, and the oldest holds all
that start-up built (modules, torch, a tokenizer: some 200,000 objects, half a second per full
collection on a busy 2-core machine, during which the event loop answers nothing, health
probes included). `freeze_startup` moves them out of its reach once a service is set up.
`release_memory` then costs little where work ends."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable


def freeze_startup() -> None:
    """Collects what start-up left and exempts everything that survived from later
    collections (they live as long as the process; refcounting still frees them)."""
    gc.collect()
    gc.freeze()


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        return None


_MALLOC_TRIM = _malloc_trim()


def release_memory() -> None:
    """Frees what finished work left behind (its reference cycles) and returns the heap's free
    pages to the kernel. glibc keeps freed memory for the process to reuse unless asked, so
    without this a process's resident memory stays at its peak, and creeps up as its heap
    fragments."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
