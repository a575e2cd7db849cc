"""The harness: the loop that talks to the model (and tools, and users) for one episode."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from rlrun.env_server.sdk.episode import Episode


class Harness(ABC):
    async def setup(self, episodes: list[Episode]) -> None:
        """Prepares one group before any model call (sandboxes, tools, per-episode state). Its
        time counts as the traces' `timing.setup_s`, not as generation; an exception fails the
        group's episodes. Default: nothing to prepare."""
        return None

    @abstractmethod
    async def run(self, episode: Episode) -> None:
        """Drives one episode until it ends, then calls `episode.finish(stop_condition)`.
        Exceptions are recorded as the episode's error (a trace with `errors`), never raised
        past the runner."""

    async def run_group(self, episodes: list[Episode]) -> None:
        """Drives the episodes of one group (same task). By default each runs on its own,
        concurrently; a harness may override this to batch model calls across the group."""
        await asyncio.gather(*(self._run_one(episode) for episode in episodes))

    async def _run_one(self, episode: Episode) -> None:
        try:
            await self.run(episode)
        except Exception as error:
            episode.fail(error)
