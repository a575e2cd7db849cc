"""Structured outputs: the tokens a row's grammar does not allow next are masked out
(rlrun.inference.structured; llguidance is loaded only by a batch that has a grammar)."""

from __future__ import annotations

import torch

from rlrun.inference.logits.base import History, LogitsProcessor, Rows


class Grammar(LogitsProcessor):
    def __init__(self, rows: Rows, device: torch.device | str):
        self.grammars = [g for _, r in rows if (g := r.grammar) is not None]
        self.rows = torch.tensor([row for row, _ in rows], device=device)
        self._bitmask: torch.Tensor | None = None
        """[grammar rows, mask words]: where the grammars write the tokens they allow (on the
        CPU, where llguidance writes)."""

    @staticmethod
    def uses(row) -> bool:
        return row.grammar is not None

    @classmethod
    def create(cls, rows: Rows, device: torch.device | str, history: History | None) -> Grammar:
        return cls(rows, device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        from rlrun.inference.structured import allowed_tokens

        if self._bitmask is None:
            self._bitmask = torch.empty(len(self.grammars), self.grammars[0].mask_words, dtype=torch.int32)
        for row, grammar in enumerate(self.grammars):
            grammar.fill_mask(self._bitmask[row])
        allowed = allowed_tokens(self._bitmask.to(logits.device), logits.shape[-1])
        rows = logits.index_select(0, self.rows).masked_fill(~allowed, float("-inf"))
        return logits.index_copy(0, self.rows, rows)
