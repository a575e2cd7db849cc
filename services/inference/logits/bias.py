"""OpenAI's `logit_bias`: a per-token amount added to the logits."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits.base import History, LogitsProcessor, RequestFields

MAX_LOGIT_BIAS = 100.0
"""A bias lies in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS] (OpenAI's range)."""


class LogitBias(LogitsProcessor):
    """Settings: {token id: bias}."""

    name = "logit_bias"
    fields = ("logit_bias",)

    def __init__(self, index: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor):
        self.index = index
        self.values = values

    @classmethod
    def read(cls, fields: RequestFields) -> dict[int, float] | None:
        value = fields.values.get("logit_bias")
        where = fields.field("logit_bias")
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise RequestError(where, f"{where} must map token ids to biases, got {value!r}")
        bias = {}
        for key, amount in value.items():
            try:
                token = int(key)
            except ValueError:
                raise RequestError(where, f"{where} keys must be token ids, got {key!r}") from None
            if isinstance(amount, bool) or not isinstance(amount, int | float):
                raise RequestError(where, f"{where} of token {token} must be a number, got {amount!r}")
            bias[token] = float(amount)
        return bias or None

    @classmethod
    def check(cls, settings: dict[int, float], params: Any, where: str, vocab_size: int | None) -> None:
        for token, bias in settings.items():
            if vocab_size is not None and not 0 <= token < vocab_size:
                raise RequestError(
                    f"{where}.logit_bias",
                    f"{where}.logit_bias has token id {token}, outside the vocabulary [0, {vocab_size})",
                )
            if not (math.isfinite(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise RequestError(
                    f"{where}.logit_bias",
                    f"{where}.logit_bias of token {token} must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], "
                    f"got {bias}",
                )

    @classmethod
    def vllm_kwargs(cls, settings: dict[int, float] | None) -> dict[str, Any]:
        return {"logit_bias": dict(settings) if settings else None}

    @classmethod
    def create(
        cls, rows: Sequence[tuple[int, dict[int, float]]], device: torch.device | str, history: History | None
    ) -> LogitBias:
        biased = [(row, token, bias) for row, settings in rows for token, bias in settings.items()]
        rows_of, tokens_of, values = zip(*biased, strict=True)
        index = (torch.tensor(rows_of, device=device), torch.tensor(tokens_of, device=device))
        return cls(index, torch.tensor(values, dtype=torch.float32, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put(self.index, self.values, accumulate=True)
