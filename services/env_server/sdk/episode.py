"""One rollout of one task, as a harness drives it.

An episode holds one conversation and one model per member. A single-agent episode has the
one member `policy`; the conversation of each member becomes one Trace (multi-agent episodes:
rlrun.env_server.sdk.multi_agent).
"""

from __future__ import annotations

import time

from rlrun.common.wire.inference import Completion
from rlrun.common.wire.trace import StopCondition
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.models import Model
from rlrun.env_server.sdk.sandbox import Sandbox
from rlrun.env_server.sdk.task import Task

POLICY = "policy"


class Episode:
    def __init__(self, task: Task, conversations: dict[str, Conversation], models: dict[str, Model]):
        self.task = task
        self.conversations = conversations
        self.models = models
        self.stop: StopCondition = ""
        self.error: BaseException | None = None
        self.metrics: dict[str, float] = {}
        """Harness metrics; they join the scorer's in the trace."""
        self.info: dict[str, str] = {}
        """Free-form facts about the episode (e.g. `learner_seat`), copied into every trace's info."""
        self.generation_s = 0.0
        self.sandbox: Sandbox | None = None
        """The episode's sandbox, when its harness made one (the rollout runner destroys it)."""

    @property
    def conversation(self) -> Conversation:
        """The policy's conversation (single-agent episodes)."""
        return self.conversations[POLICY]

    @property
    def answer(self) -> str:
        """The policy's latest assistant message."""
        return self.conversation.last_text("assistant")

    @property
    def done(self) -> bool:
        return bool(self.stop) or self.error is not None

    def finish(self, stop: StopCondition = "completed") -> None:
        self.stop = stop

    def fail(self, error: BaseException) -> None:
        self.error = error

    async def generate(self, member: str = POLICY) -> Completion:
        """One assistant turn of `member`, appended to its conversation."""
        conversation = self.conversations[member]
        started = time.perf_counter()
        [completion] = await self.models[member].complete(conversation.prompt_ids(), 1)
        self.generation_s += time.perf_counter() - started
        conversation.add_completion(completion)
        return completion


async def generate_group(episodes: list[Episode], member: str = POLICY) -> list[Completion]:
    """One assistant turn for every episode of a group that shares `member`'s prompt and model,
    as ONE model call with n = len(episodes) (the fast path of single-turn groups)."""
    first = episodes[0].conversations[member]
    prompt = first.prompt_ids()
    for episode in episodes[1:]:
        if episode.conversations[member].prompt_ids() != prompt:
            raise ValueError("generate_group needs episodes whose prompts are identical")
    started = time.perf_counter()
    completions = await episodes[0].models[member].complete(prompt, len(episodes))
    elapsed = time.perf_counter() - started
    for episode, completion in zip(episodes, completions, strict=True):
        episode.generation_s += elapsed
        episode.conversations[member].add_completion(completion)
    return completions
