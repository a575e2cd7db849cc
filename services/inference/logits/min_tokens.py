"""`min_tokens`: a row's stop tokens are masked out until it has generated that many."""

from __future__ import annotations

import torch

from rlrun.inference.logits.base import History, LogitsProcessor, Rows, knobs, token_mask


class MinTokens(LogitsProcessor):
    def __init__(self, held: torch.Tensor, stops: list[tuple[int, ...]], tokens_left: torch.Tensor):
        self.held = held
        """The rows whose stop tokens are masked out for now."""
        self._stops = stops
        self._mask: torch.Tensor | None = None
        self._tokens_left = tokens_left

    @staticmethod
    def uses(row) -> bool:
        a = row.adjustments
        return a is not None and bool(a.min_tokens) and bool(a.stop_token_ids)

    @classmethod
    def create(cls, rows: Rows, device: torch.device | str, history: History | None) -> MinTokens | None:
        if history is None:
            raise ValueError("penalised and min_tokens rows need their history")
        held = [(row, knobs(r)) for row, r in rows if knobs(r).min_tokens > len(history(row)[1])]
        if not held:
            return None
        return cls(
            torch.tensor([row for row, _ in held], device=device),
            [a.stop_token_ids for _, a in held],
            torch.tensor([a.min_tokens - len(history(row)[1]) for row, a in held], device=device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._mask is None:
            self._mask = token_mask(self._stops, logits.shape[-1], logits.device)
        masked = self._mask & (self._tokens_left > 0)[:, None]
        rows = logits.index_select(0, self.held).masked_fill(masked, float("-inf"))
        return logits.index_copy(0, self.held, rows)

    def record(self, tokens: torch.Tensor) -> None:
        self._tokens_left -= 1
