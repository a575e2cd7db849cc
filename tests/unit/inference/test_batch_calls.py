"""A batch of prompts as one call: all or none, one numbered stream, nothing left running."""

import asyncio

import pytest

from rlrun.common.aio import all_or_nothing
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.batch_calls import primed_streams
from rlrun.inference.engines.base import QueueFullError, StreamDelta


class StreamingEngine:
    """Streams one token per sample and step, forever; prompt [0] finds the queue full.
    Records which prompts' streams are still open."""

    def __init__(self):
        self.open: set[int] = set()

    async def stream(self, prompt, params):
        if prompt == [0]:
            raise QueueFullError("full")
        self.open.add(prompt[0])
        try:
            step = 0
            while True:
                yield [StreamDelta(j, [prompt[0] * 100 + step], [-0.5]) for j in range(params.n)]
                step += 1
                await asyncio.sleep(0)
        finally:
            self.open.discard(prompt[0])


def requests(*first_tokens: int, n: int = 2):
    return [([token], SamplingParams(max_tokens=4, n=n)) for token in first_tokens]


async def test_the_streams_of_a_batch_are_one_numbered_stream():
    engine = StreamingEngine()
    first, rest = await primed_streams(engine, requests(1, 2, 3))
    # Sample j of prompt i is choice i * n + j, starting from the first tokens of each.
    assert [(d.index, d.token_ids) for d in first] == [
        (0, [100]),
        (1, [100]),
        (2, [200]),
        (3, [200]),
        (4, [300]),
        (5, [300]),
    ]
    seen = {}
    for _ in range(6):
        for delta in await anext(rest):
            seen.setdefault(delta.index, []).append(delta.token_ids[0])
    assert {index: tokens[0] // 100 for index, tokens in seen.items()} == {
        0: 1,
        1: 1,
        2: 2,
        3: 2,
        4: 3,
        5: 3,
    }
    assert engine.open == {1, 2, 3}
    await rest.aclose()  # the client left
    assert engine.open == set()


async def test_a_batch_whose_prompt_finds_the_queue_full_leaves_nothing_running():
    engine = StreamingEngine()
    with pytest.raises(QueueFullError):
        await primed_streams(engine, requests(1, 0, 2))
    assert engine.open == set()


async def test_one_failed_call_cancels_the_others():
    cancelled = []

    async def waits(name):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def fails():
        await asyncio.sleep(0)
        raise QueueFullError("full")

    with pytest.raises(QueueFullError):
        await all_or_nothing([waits("a"), fails(), waits("b")])
    assert sorted(cancelled) == ["a", "b"]
    assert await all_or_nothing([asyncio.sleep(0, "x"), asyncio.sleep(0, "y")]) == ["x", "y"]
