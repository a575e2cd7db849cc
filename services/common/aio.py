"""asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def all_or_nothing(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Every call's result, run concurrently, or the first error after cancelling the calls
    still running (so that, say, their requests leave an engine's queue)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
