"""Several engine calls made for one HTTP request (a batch of prompts) as one call.

A batch succeeds or fails whole: when one prompt's call fails (a full queue), the others are
cancelled, so their requests leave the engine. Their token streams become one stream whose
choices are numbered as OpenAI numbers them: sample j of prompt i is choice i * n + j.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import replace

from rlrun.common.aio import all_or_nothing
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.base import Engine, StreamDelta


def _numbered(deltas: list[StreamDelta], first_choice: int) -> list[StreamDelta]:
    """Sample j of a prompt whose choices start at `first_choice` is choice first_choice + j."""
    if first_choice == 0:
        return deltas
    return [replace(delta, index=first_choice + delta.index) for delta in deltas]


async def primed_streams(
    engine: Engine, requests: Sequence[tuple[Sequence[int], SamplingParams]]
) -> tuple[list[StreamDelta], AsyncGenerator[list[StreamDelta], None]]:
    """The token streams of every prompt as one, numbered as choices. Waits for each prompt's
    first tokens, so that a full queue still becomes an error status rather than a broken
    event stream."""
    streams = [engine.stream(prompt, params) for prompt, params in requests]
    try:
        firsts = await all_or_nothing([anext(stream, []) for stream in streams])
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise
    if len(streams) == 1:
        return firsts[0], streams[0]
    n = requests[0][1].n
    first = [delta for i, deltas in enumerate(firsts) for delta in _numbered(deltas, i * n)]
    return first, _merged(streams, n)


async def _merged(
    streams: list[AsyncGenerator[list[StreamDelta], None]], n: int
) -> AsyncGenerator[list[StreamDelta], None]:
    """Deltas of the streams as they come; stream i's sample j is choice i * n + j."""
    arrivals: asyncio.Queue = asyncio.Queue()

    async def forward(first_choice: int, stream: AsyncIterator[list[StreamDelta]]) -> None:
        try:
            async for deltas in stream:
                arrivals.put_nowait(_numbered(deltas, first_choice))
        except Exception as error:
            arrivals.put_nowait(error)
        else:
            arrivals.put_nowait(None)

    tasks = [asyncio.create_task(forward(i * n, stream)) for i, stream in enumerate(streams)]
    try:
        open_streams = len(tasks)
        while open_streams:
            item = await arrivals.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
