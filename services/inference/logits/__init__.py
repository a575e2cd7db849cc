"""Logits processors: each OpenAI-only sampling knob as one class behind `LogitsProcessor`,
from the request field that asks for it to the logits of the rows that use it.

Adding a knob is one module here (a `LogitsProcessor` subclass: its `name`, the request
`fields` it reads, `read`, `check`, `create`, `apply`, and where needed `prepare`, `record`,
`ends`, `vllm_kwargs`) and one line: `register(TheKnob)`. The request models, the engines and
the sampler ask the registry; none of them names a knob. A knob outside rlrun is an entry
point of group `rlrun.knobs` (`rlrun.common.registry`): every process that reads the registry
finds it, the torch engine's spawned process too, without a hand import."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlrun.common.errors import RequestError
from rlrun.common.registry import Registry
from rlrun.inference.logits.base import (
    EngineResources,
    History,
    LogitsProcessor,
    RequestFields,
    RowState,
    Settings,
)
from rlrun.inference.logits.bias import LogitBias
from rlrun.inference.logits.grammar import Grammar
from rlrun.inference.logits.min_tokens import MinTokens
from rlrun.inference.logits.penalties import Penalties

PROCESSORS: Registry[type[LogitsProcessor]] = Registry("sampling knob", "rlrun.knobs", LogitsProcessor)
"""The registered knobs by name, in the order the sampler applies them (installed ones last)."""


def register(processor: type[LogitsProcessor]) -> type[LogitsProcessor]:
    """Adds a knob, applied after those registered before it."""
    return PROCESSORS.register(processor.name, processor)


# In vLLM's order: the bias, the min_tokens mask of the stop tokens, the repetition then the
# presence and frequency penalties, then the grammar's mask.
register(LogitBias)
register(MinTokens)
register(Penalties)
register(Grammar)


def request_fields() -> frozenset[str]:
    """Every request field some knob reads."""
    return frozenset(field for processor in PROCESSORS.values() for field in processor.fields)


def read_knobs(fields: RequestFields) -> dict[str, Settings]:
    """The settings of every knob the request asks for, by name."""
    knobs = {}
    for name, processor in PROCESSORS.items():
        settings = processor.read(fields)
        if settings is not None:
            knobs[name] = settings
    return knobs


def _processor(name: str) -> type[LogitsProcessor]:
    try:
        return PROCESSORS[name]
    except KeyError:
        raise RequestError(name, f"{name} is not a sampling knob of this engine") from None


def check_knobs(knobs: Mapping[str, Settings], params: Any, where: str, vocab_size: int | None) -> None:
    for name, settings in knobs.items():
        _processor(name).check(settings, params, where, vocab_size)


def prepare_knobs(params: Any, resources: EngineResources) -> dict[str, Sequence[RowState]]:
    """Each knob's row state for each sample of a request (`GenerationParams`), by name."""
    states = {}
    for name, settings in params.knobs.items():
        prepared = _processor(name).prepare(settings, params, resources)
        if prepared is not None:
            states[name] = prepared
    return states


def sample_ends(knobs: Mapping[str, RowState], token: int) -> bool:
    """Whether a knob of a row ends its sample with `token` (every knob hears of it)."""
    ended = False
    for name, state in knobs.items():
        ended |= PROCESSORS[name].ends(state, token)
    return ended


def vllm_kwargs(knobs: Mapping[str, Settings]) -> dict[str, Any]:
    """vllm.SamplingParams keyword arguments of every registered knob (neutral where unset)."""
    for name in knobs:
        _processor(name)
    kwargs: dict[str, Any] = {}
    for name, processor in PROCESSORS.items():
        kwargs |= processor.vllm_kwargs(knobs.get(name))
    return kwargs


__all__ = [
    "PROCESSORS",
    "EngineResources",
    "Grammar",
    "History",
    "LogitBias",
    "LogitsProcessor",
    "MinTokens",
    "Penalties",
    "RequestFields",
    "check_knobs",
    "prepare_knobs",
    "read_knobs",
    "register",
    "request_fields",
    "sample_ends",
    "vllm_kwargs",
]
