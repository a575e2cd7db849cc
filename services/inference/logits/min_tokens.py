"""vLLM's `min_tokens`: a row's stop tokens are masked out until it has generated that many
(so the logprobs exclude them). The OpenAI app also holds off its stop sequences meanwhile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits.base import (
    EngineResources,
    History,
    LogitsProcessor,
    RequestFields,
    needs_history,
    token_mask,
)


class MinTokens(LogitsProcessor):
    """Settings: the count; row state: (the count, the request's stop tokens)."""

    name = "min_tokens"
    fields = ("min_tokens",)

    def __init__(self, held: torch.Tensor, stops: list[tuple[int, ...]], tokens_left: torch.Tensor):
        self.held = held
        """The rows whose stop tokens are masked out for now."""
        self._stops = stops
        self._mask: torch.Tensor | None = None
        self._tokens_left = tokens_left

    @classmethod
    def read(cls, fields: RequestFields) -> int | None:
        return fields.integer("min_tokens") or None

    @classmethod
    def check(cls, settings: int, params: Any, where: str, vocab_size: int | None) -> None:
        if not 0 <= settings <= params.max_tokens:
            raise RequestError(
                f"{where}.min_tokens",
                f"{where}.min_tokens must be in [0, max_tokens = {params.max_tokens}], got {settings}",
            )

    @classmethod
    def vllm_kwargs(cls, settings: int | None) -> dict[str, Any]:
        return {"min_tokens": settings or 0}

    @classmethod
    def prepare(
        cls, settings: int, params: Any, resources: EngineResources
    ) -> list[tuple[int, tuple[int, ...]]] | None:
        if not params.stop_token_ids:
            return None
        return [(settings, tuple(params.stop_token_ids))] * params.n

    @classmethod
    def create(
        cls,
        rows: Sequence[tuple[int, tuple[int, tuple[int, ...]]]],
        device: torch.device | str,
        history: History | None,
    ) -> MinTokens | None:
        generated = needs_history(history)
        held = [(row, count - len(generated(row)[1]), stops) for row, (count, stops) in rows]
        held = [entry for entry in held if entry[1] > 0]
        if not held:
            return None
        return cls(
            torch.tensor([row for row, _, _ in held], device=device),
            [stops for _, _, stops in held],
            torch.tensor([left for _, left, _ in held], device=device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._mask is None:
            self._mask = token_mask(self._stops, logits.shape[-1], logits.device)
        masked = self._mask & (self._tokens_left > 0)[:, None]
        rows = logits.index_select(0, self.held).masked_fill(masked, float("-inf"))
        return logits.index_copy(0, self.held, rows)

    def record(self, tokens: torch.Tensor) -> None:
        self._tokens_left -= 1
