"""The repetition penalty (over the prompt and the tokens generated so far), then the presence
and frequency penalties (over the tokens generated so far), as vLLM applies them.

A penalised row counts the tokens it has generated: from `history` when the batch is built,
then from what is sampled (`record`), so every sampled token must be appended to its row
before the batch's sampler is rebuilt."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlrun.inference.logits.base import History, LogitsProcessor, Rows, knobs, token_mask


class Penalties(LogitsProcessor):
    def __init__(self, rows: Rows, device: torch.device | str, history: History):
        self.penalised = torch.tensor([row for row, _ in rows], device=device)
        adjustments = [knobs(r) for _, r in rows]
        self.presence = torch.tensor([a.presence_penalty for a in adjustments], device=device)[:, None]
        self.frequency = torch.tensor([a.frequency_penalty for a in adjustments], device=device)[:, None]
        self.repetition: torch.Tensor | None = None
        if any(a.repetition_penalty != 1 for a in adjustments):
            self.repetition = torch.tensor([a.repetition_penalty for a in adjustments], device=device)[
                :, None
            ]
        # The generated tokens as they are now: the rows append to them after each step.
        self._histories = [(prompt, list(generated)) for prompt, generated in (history(r) for r, _ in rows)]
        self._rows = torch.arange(len(rows), device=device)
        self._counts: torch.Tensor | None = None
        """[penalised rows, V]: how often each has generated each token."""
        self._in_prompt: torch.Tensor | None = None
        """[penalised rows, V]: the tokens of each one's prompt (with a repetition penalty)."""

    @staticmethod
    def uses(row) -> bool:
        return row.adjustments is not None and row.adjustments.penalised

    @classmethod
    def create(cls, rows: Rows, device: torch.device | str, history: History | None) -> Penalties:
        if history is None:
            raise ValueError("penalised and min_tokens rows need their history")
        return cls(rows, device, history)

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
