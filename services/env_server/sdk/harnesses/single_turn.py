"""Prompt in, one assistant message out."""

from __future__ import annotations

from rlrun.env_server.sdk.episode import Episode, generate_group
from rlrun.env_server.sdk.harness import Harness


class SingleTurnHarness(Harness):
    async def run(self, episode: Episode) -> None:
        completion = await episode.generate()
        episode.finish("length" if completion.finish_reason == "length" else "completed")

    async def run_group(self, episodes: list[Episode]) -> None:
        """The whole group in one model call with n = group size."""
        for episode, completion in zip(episodes, await generate_group(episodes), strict=True):
            episode.finish("length" if completion.finish_reason == "length" else "completed")
