"""Logits processors: each OpenAI-only sampling knob as one class behind `LogitsProcessor`
(in the spirit of vLLM v1's), applied by the sampler to the rows that use it, in the order of
`PROCESSORS`. A new knob is a module here and a line in `PROCESSORS`."""

from __future__ import annotations

from rlrun.inference.logits.base import History, LogitsProcessor
from rlrun.inference.logits.bias import LogitBias
from rlrun.inference.logits.grammar import Grammar
from rlrun.inference.logits.min_tokens import MinTokens
from rlrun.inference.logits.penalties import Penalties

PROCESSORS: tuple[type[LogitsProcessor], ...] = (LogitBias, MinTokens, Penalties, Grammar)
"""In vLLM's order: the bias, the min_tokens mask of the stop tokens, the repetition then the
presence and frequency penalties, then the grammar's mask (the last word on what may be drawn)."""

__all__ = ["PROCESSORS", "Grammar", "History", "LogitBias", "LogitsProcessor", "MinTokens", "Penalties"]
