"""Multi-agent episodes: members speak in the slots of a turn schedule, each with its own view.

A slot of one member is sequential: the member speaks and its message is committed. A slot of
several members is simultaneous: they all speak on the same history (none sees another's
message of the slot), and the slot commits atomically: every message, or none of them when
any member's call fails (or the episode is cancelled) before all have answered.

Each member has its own conversation, which becomes its own Trace. Before a member speaks, its
conversation catches up on the others' public messages since its last turn, as user
observations rendered by a `View`. What a member writes inside `<think>...</think>` is private:
it stays in its own conversation and never reaches the others. A message with malformed think
markup is committed with `parse_error` (its tokens never train) and shows nothing to the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlrun.common.aio import all_or_nothing
from rlrun.common.wire.inference import Completion
from rlrun.common.wire.plan import MemberRole
from rlrun.env_server.sdk.channels import public_text
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.models import Model
from rlrun.env_server.sdk.task import Task

Slot = tuple[str, ...]
"""The members that speak in one slot: one member is a sequential slot, several a simultaneous one."""

LEARNER_SEAT = "learner_seat"
"""Trace info key of the seat the learner played in the episode."""


@dataclass(frozen=True)
class PublicMessage:
    speaker: str
    text: str
    """The public channel: the message without its think blocks ("" when the markup was malformed)."""


View = Callable[[str, PublicMessage], "str | None"]
"""(viewer, message of another member) -> the observation the viewer gets, or None to hide it."""


def check_slot(slot: Slot) -> None:
    if not slot or len(set(slot)) != len(slot):
        raise ValueError(f"a slot must name one or more distinct members, got {slot}")


def speaker_view(viewer: str, message: PublicMessage) -> str:
    return f"{message.speaker}: {message.text}"


class MultiAgentEpisode(Episode):
    def __init__(
        self,
        task: Task,
        conversations: dict[str, Conversation],
        models: dict[str, Model],
        roles: dict[str, MemberRole],
        index: int = 0,
    ):
        super().__init__(task, conversations, models)
        self.roles = roles
        """Per member, its plan role: `train` (the learner) or `fixed`."""
        self.index = index
        """Position of the episode within its group (seat rotation, seeded rule players)."""
        self.public: list[PublicMessage] = []
        """Every committed message's public channel, in order."""
        self._shown = dict.fromkeys(conversations, 0)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self.conversations)

    def public_answer(self, member: str) -> str:
        """The public channel of `member`'s latest message ("" when it has not spoken)."""
        return next((m.text for m in reversed(self.public) if m.speaker == member), "")

    def _catch_up(self, member: str, view: View) -> None:
        conversation = self.conversations[member]
        for message in self.public[self._shown[member] :]:
            if message.speaker == member:
                continue
            observation = view(member, message)
            if observation is not None:
                conversation.add_observation("user", observation)
        self._shown[member] = len(self.public)

    async def play(self, slot: Slot, view: View = speaker_view) -> list[Completion]:
        """One slot: its members catch up, speak on that history, and commit together."""
        check_slot(slot)
        unknown = [m for m in slot if m not in self.conversations]
        if unknown:
            raise ValueError(f"slot {slot} names {unknown}, which are not members of {self.members}")
        for member in slot:
            self._catch_up(member, view)
        started = time.perf_counter()
        results = await all_or_nothing(
            [self.models[m].complete(self.conversations[m].prompt_ids(), 1) for m in slot]
        )
        self.generation_s += time.perf_counter() - started
        completions = [completion for [completion] in results]
        for member, completion in zip(slot, completions, strict=True):
            conversation = self.conversations[member]
            public = public_text(conversation.tokenizer.decode(completion.token_ids))
            conversation.add_completion(completion, parse_error=public is None)
            self.public.append(PublicMessage(member, public or ""))
        return completions


def learner_seat(episode: MultiAgentEpisode, seats: Sequence[str]) -> str:
    """The seat the learner plays: the one seat of a `train` member; when several seats are
    `train` (self-play), they take turns by the episode's index in its group."""
    learners = [seat for seat in seats if episode.roles[seat] == "train"]
    if not learners:
        raise ValueError(f"no seat of {list(seats)} is played by a `train` member (roles: {episode.roles})")
    return learners[episode.index % len(learners)]
