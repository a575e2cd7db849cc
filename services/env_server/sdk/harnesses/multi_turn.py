"""Several assistant turns; the environment's feedback arrives as user messages."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.task import Task

Respond = Callable[[Task, Episode], "str | None | Awaitable[str | None]"]
"""The environment's turn: feedback for the latest answer, or None to end the episode."""


class MultiTurnHarness(Harness):
    """Up to `max_turns` assistant turns. After each, `respond` gives feedback (a user message)
    or None (the episode is complete). With `rewrite_history`, feedback replaces the failed
    attempt instead of following it: the conversation rewinds to the prompt and the feedback
    forks a new branch there, so the model never sees its earlier attempts (the feedback must
    then say whatever the model needs), and the trace has one branch per attempt."""

    def __init__(self, respond: Respond, max_turns: int = 3, rewrite_history: bool = False):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.respond = respond
        self.max_turns = max_turns
        self.rewrite_history = rewrite_history

    async def run(self, episode: Episode) -> None:
        conversation = episode.conversation
        prompt_end = conversation.cursor
        for turn in range(1, self.max_turns + 1):
            episode.metrics["turns"] = turn
            completion = await episode.generate()
            if completion.finish_reason == "length":
                return episode.finish("length")
            feedback = self.respond(episode.task, episode)
            if inspect.isawaitable(feedback):
                feedback = await feedback
            if feedback is None:
                return episode.finish("completed")
            if turn == self.max_turns:
                break
            if self.rewrite_history:
                conversation.rewind(prompt_end)
            conversation.add_observation("user", feedback)
        episode.finish("max_turns")
