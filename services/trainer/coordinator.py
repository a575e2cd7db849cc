"""Rank 0 drives every rank through the same sequence of learner calls.

Collectives (FSDP's all-gathers, DDP's all-reduces, state-dict gathers) need every rank to
make the same calls in the same order. Rank 0 receives work over gRPC; before running a call
itself it broadcasts the call as a command, and the other ranks, blocked in `serve_commands`,
run the same call. On a single process the coordinator simply calls the learner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlrun.common.wire.trainer import StepResult
from rlrun.common.wire.training import TrainingBatch
from rlrun.trainer.checkpoint import load_checkpoint
from rlrun.trainer.distributed import CommandChannel
from rlrun.trainer.learner import Learner, LearnerState


@dataclass(frozen=True)
class Train:
    batch: TrainingBatch


@dataclass(frozen=True)
class GatherWeights:
    on_cpu: bool


@dataclass(frozen=True)
class CaptureState:
    pass


@dataclass(frozen=True)
class RestoreState:
    checkpoint: str
    """Every rank reads the folder itself (it is on the volume all ranks share): the state
    never travels over the command channel."""


@dataclass(frozen=True)
class Stop:
    pass


Command = Train | GatherWeights | CaptureState | RestoreState | Stop


def execute(learner: Learner, command: Command):
    match command:
        case Train(batch):
            return learner.train(batch)
        case GatherWeights(on_cpu):
            return learner.full_weights(on_cpu)
        case CaptureState():
            return learner.capture_state()
        case RestoreState(checkpoint):
            state, _ = load_checkpoint(Path(checkpoint))
            return learner.restore_state(state)
        case Stop():
            return None
    raise TypeError(f"unknown trainer command {command!r}")


class Coordinator:
    """Rank 0's handle on all ranks. Calls must not overlap (the servicer serializes them)."""

    def __init__(self, learner: Learner, channel: CommandChannel | None):
        self.learner = learner
        self.channel = channel

    def _run(self, command: Command):
        if self.channel is not None:
            self.channel.send(command)
        return execute(self.learner, command)

    def train(self, batch: TrainingBatch) -> StepResult:
        return self._run(Train(batch))

    def gather_weights(self, on_cpu: bool = True) -> dict[str, torch.Tensor]:
        return self._run(GatherWeights(on_cpu))

    def capture_state(self) -> LearnerState:
        return self._run(CaptureState())

    def restore(self, checkpoint: Path) -> None:
        self._run(RestoreState(str(checkpoint)))

    def stop(self) -> None:
        self._run(Stop())


def serve_commands(learner: Learner, channel: CommandChannel) -> None:
    """The loop of every rank but 0: run rank 0's commands until Stop."""
    while True:
        command = channel.receive()
        execute(learner, command)
        if isinstance(command, Stop):
            return
