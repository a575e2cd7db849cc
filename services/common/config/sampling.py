"""Sampling settings: [orchestrator.train.sampling] and per-env / eval overrides."""

from __future__ import annotations

from pydantic import Field

from rlrun.common.config.base import Section


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; 0 decodes greedily. Default: 1.0."""

    max_completion_tokens: int = Field(16, gt=0)
    """Most tokens the model may generate per turn. Default: 16."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass. Default: 1.0 (off)."""

    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens; 0 is off. Default: 0."""


class SamplingOverrides(Section):
    """Per-env or eval overrides; an unset field inherits [orchestrator.train.sampling]."""

    temperature: float | None = Field(None, ge=0)
    """Overrides `temperature`. Default: inherit."""

    max_completion_tokens: int | None = Field(None, gt=0)
    """Overrides `max_completion_tokens`. Default: inherit."""

    top_p: float | None = Field(None, gt=0, le=1)
    """Overrides `top_p`. Default: inherit."""

    top_k: int | None = Field(None, ge=0)
    """Overrides `top_k`. Default: inherit."""

    def apply(self, base: SamplingConfig) -> SamplingConfig:
        return base.model_copy(update=self.model_dump(exclude_none=True))
