"""The interface of a logits processor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from rlrun.inference.sampler import LogitAdjustments, RowSettings

History = Callable[[int], tuple[Sequence[int], Sequence[int]]]
"""Row -> (its prompt, the tokens it has generated so far)."""

Rows = Sequence[tuple[int, "RowSettings"]]
"""(row of the batch, its settings) of the rows a processor acts on."""


class LogitsProcessor(ABC):
    """One knob over a batch's logits [B, V], before temperature. The sampler builds one per
    batch composition (`create`, vLLM's update_state) from the rows that use it, calls `apply`
    on every step and `record` with the tokens sampled."""

    argmax_invariant: ClassVar[bool] = False
    """True when it never changes a row's most likely token (as min-p does): an all-greedy batch
    may skip it. None of the OpenAI knobs is: a bias, a mask or a penalty can move the argmax."""

    @staticmethod
    @abstractmethod
    def uses(row: RowSettings) -> bool:
        """Whether the row asks for this knob."""

    @classmethod
    @abstractmethod
    def create(
        cls, rows: Rows, device: torch.device | str, history: History | None
    ) -> LogitsProcessor | None:
        """The processor of a batch for the `rows` that use it (None: nothing to do now)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with the knob applied (a new tensor or `logits` itself)."""

    def record(self, tokens: torch.Tensor) -> None:  # noqa: B027 - most processors keep no state
        """The tokens just sampled, one per row of the batch."""


def token_mask(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab]: True at each row's tokens."""
    mask = torch.zeros(len(token_lists), vocab, dtype=torch.bool, device=device)
    for row, tokens in enumerate(token_lists):
        mask[row, list(tokens)] = True
    return mask


def knobs(row: RowSettings) -> LogitAdjustments:
    """The row's OpenAI knobs (only rows that have them reach a processor that reads them)."""
    assert row.adjustments is not None
    return row.adjustments
