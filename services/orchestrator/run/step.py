"""What one training step carries from collection to its record, and the run's own errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlrun.common.wire.trainer import StepResult
from rlrun.common.wire.training import EncodedSamples
from rlrun.orchestrator.credit.batching import BuiltBatch


class RunFailed(RuntimeError):
    """A reason to stop the run that is not a bug: the message says what happened."""


class RunStopped(Exception):
    """Stop was requested while a batch was being collected."""


@dataclass
class BuiltStep:
    batch: BuiltBatch
    encoded: EncodedSamples
    gen_seconds: float
    build_seconds: float
    credit_state: dict[str, dict[str, Any]]
    """The phase's algorithm state right after crediting this batch: what a checkpoint taken
    once the batch trained saves (the next batch is already credited by then)."""


@dataclass
class StepOutcome:
    built: BuiltStep
    result: StepResult
    train_seconds: float
    off_policy_lag: int
    policy_version: int
    """The version the batch trained at."""


@dataclass
class StepRecord:
    """A trained step as it is recorded: its number in its phase, its batch and its line."""

    number: int
    batch: BuiltBatch
    line: dict[str, Any]
