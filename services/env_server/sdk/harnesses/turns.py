"""Multi-agent turns: the members speak slot by slot, following a schedule."""

from __future__ import annotations

from collections.abc import Sequence

from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.multi_agent import (
    LEARNER_SEAT,
    MultiAgentEpisode,
    Slot,
    View,
    check_slot,
    learner_seat,
    speaker_view,
)


class TurnHarness(Harness):
    """Plays every slot of `schedule` in order (see rlrun.env_server.sdk.multi_agent for what a
    sequential and a simultaneous slot are), with `view` rendering the others' public messages.
    With `seats` (the members that compete), the seat the learner plays is recorded in the
    traces' info as `learner_seat`. A truncated message does not end the episode: the member
    said what it said."""

    def __init__(self, schedule: Sequence[Slot], seats: Sequence[str] = (), view: View = speaker_view):
        if not schedule:
            raise ValueError("a turn schedule needs at least one slot")
        for slot in schedule:
            check_slot(tuple(slot))
        self.schedule = [tuple(slot) for slot in schedule]
        self.seats = tuple(seats)
        self.view = view

    async def run(self, episode: Episode) -> None:
        if not isinstance(episode, MultiAgentEpisode):
            raise TypeError("TurnHarness drives multi-agent episodes; is the env's `members` set?")
        if self.seats:
            episode.info[LEARNER_SEAT] = learner_seat(episode, self.seats)
        for slot in self.schedule:
            await episode.play(slot, self.view)
        episode.finish("completed")
