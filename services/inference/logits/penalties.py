"""The repetition penalty (over the prompt and the tokens generated so far), then the presence
and frequency penalties (over the tokens generated so far), as vLLM applies them.

A penalised row counts the tokens it has generated: from `history` when the batch is built,
then from what is sampled (`record`), so every sampled token must be appended to its row
before the batch's sampler is rebuilt."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits.base import History, LogitsProcessor, RequestFields, needs_history, token_mask

MAX_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-MAX_PENALTY, MAX_PENALTY] (OpenAI's range)."""


@dataclass(frozen=True)
class PenaltySettings:
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the sample has generated so far."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the sample has generated it so far."""
    repetition_penalty: float = 1.0
    """vLLM's and transformers': the logit of every token in the prompt or generated so far
    is divided by it where positive, multiplied by it where negative (1: no penalty)."""


NEUTRAL = PenaltySettings()


class Penalties(LogitsProcessor):
    """Settings: `PenaltySettings`."""

    name = "penalties"
    fields = ("presence_penalty", "frequency_penalty", "repetition_penalty")

    def __init__(
        self, rows: Sequence[tuple[int, PenaltySettings]], device: torch.device | str, history: History
    ):
        self.penalised = torch.tensor([row for row, _ in rows], device=device)
        settings = [s for _, s in rows]
        self.presence = torch.tensor([s.presence_penalty for s in settings], device=device)[:, None]
        self.frequency = torch.tensor([s.frequency_penalty for s in settings], device=device)[:, None]
        self.repetition: torch.Tensor | None = None
        if any(s.repetition_penalty != 1 for s in settings):
            self.repetition = torch.tensor([s.repetition_penalty for s in settings], device=device)[:, None]
        # The generated tokens as they are now: the rows append to them after each step.
        self._histories = [(prompt, list(generated)) for prompt, generated in (history(r) for r, _ in rows)]
        self._rows = torch.arange(len(rows), device=device)
        self._counts: torch.Tensor | None = None
        """[penalised rows, V]: how often each has generated each token."""
        self._in_prompt: torch.Tensor | None = None
        """[penalised rows, V]: the tokens of each one's prompt (with a repetition penalty)."""

    @classmethod
    def read(cls, fields: RequestFields) -> PenaltySettings | None:
        presence, frequency, repetition = (fields.number(name) for name in cls.fields)
        settings = PenaltySettings(
            presence or 0.0, frequency or 0.0, 1.0 if repetition is None else repetition
        )
        return None if settings == NEUTRAL else settings

    @classmethod
    def check(cls, settings: PenaltySettings, params: Any, where: str, vocab_size: int | None) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(settings, name)
            if not (math.isfinite(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise RequestError(
                    f"{where}.{name}",
                    f"{where}.{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}",
                )
        repetition = settings.repetition_penalty
        if not (math.isfinite(repetition) and repetition > 0):
            raise RequestError(
                f"{where}.repetition_penalty",
                f"{where}.repetition_penalty must be a finite number > 0, got {repetition}",
            )

    @classmethod
    def vllm_kwargs(cls, settings: PenaltySettings | None) -> dict[str, Any]:
        s = settings or NEUTRAL
        return {
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repetition_penalty,
        }

    @classmethod
    def create(
        cls, rows: Sequence[tuple[int, PenaltySettings]], device: torch.device | str, history: History | None
    ) -> Penalties:
        return cls(rows, device, needs_history(history))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        counts = self._counts if self._counts is not None else self._start(logits.shape[-1], logits.device)
        rows = logits.index_select(0, self.penalised)
        if self.repetition is not None:
            assert self._in_prompt is not None
            factor = torch.where(rows > 0, 1 / self.repetition, self.repetition)
            rows = torch.where(self._in_prompt | (counts > 0), rows * factor, rows)
        rows = rows - counts * self.frequency - (counts > 0) * self.presence
        return logits.index_copy(0, self.penalised, rows)

    def record(self, tokens: torch.Tensor) -> None:
        assert self._counts is not None, "record follows apply"
        self._count(self._counts, self._rows, tokens[self.penalised])

    def _start(self, vocab: int, device: torch.device) -> torch.Tensor:
        counts = self._counts = torch.zeros(len(self._histories), vocab, device=device)
        generated = [tokens for _, tokens in self._histories]
        self._count(
            counts,
            [row for row, tokens in enumerate(generated) for _ in tokens],
            [t for ts in generated for t in ts],
        )
        if self.repetition is not None:
            self._in_prompt = token_mask([prompt for prompt, _ in self._histories], vocab, device)
        return counts

    @staticmethod
    def _count(
        counts: torch.Tensor, rows: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor
    ) -> None:
        index = tuple(torch.as_tensor(x, dtype=torch.long, device=counts.device) for x in (rows, tokens))
        counts.index_put_(index, torch.ones(len(index[0]), device=counts.device), accumulate=True)
