"""OpenAI's `logit_bias`: a per-token amount added to the logits."""

from __future__ import annotations

import torch

from rlrun.inference.logits.base import History, LogitsProcessor, Rows, knobs


class LogitBias(LogitsProcessor):
    def __init__(self, index: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor):
        self.index = index
        self.values = values

    @staticmethod
    def uses(row) -> bool:
        return row.adjustments is not None and bool(row.adjustments.logit_bias)

    @classmethod
    def create(cls, rows: Rows, device: torch.device | str, history: History | None) -> LogitBias | None:
        biased = [(row, token, bias) for row, r in rows for token, bias in knobs(r).logit_bias.items()]
        if not biased:
            return None
        rows_of, tokens_of, values = zip(*biased, strict=True)
        index = (torch.tensor(rows_of, device=device), torch.tensor(tokens_of, device=device))
        return cls(index, torch.tensor(values, dtype=torch.float32, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put(self.index, self.values, accumulate=True)
