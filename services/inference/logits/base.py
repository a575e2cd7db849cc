"""The interface of a logits processor, and how a request's fields reach one."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from rlrun.common.errors import RequestError

if TYPE_CHECKING:
    from rlrun.common.wire.sampling import SamplingParams
    from rlrun.inference.structured import GrammarCompiler

History = Callable[[int], tuple[Sequence[int], Sequence[int]]]
"""Row -> (its prompt, the tokens it has generated so far)."""

Settings = Any
"""What a request asks of a knob: read once per request, it crosses to the engine process
(so it pickles: numbers, tuples, frozen dataclasses)."""
RowState = Any
"""What one sample carries of a knob (`prepare`: the request's settings, or its own state)."""


@dataclass(frozen=True)
class RequestFields:
    """A request's fields as sent (declared by its model or not), for the knobs to read."""

    values: Mapping[str, Any]
    where: str = ""
    """How errors name a field: `where.field` (the field alone where empty, as OpenAI names
    a top-level field)."""

    def field(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def number(self, name: str) -> float | None:
        """A finite number, or None when unset."""
        value = self.values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RequestError(self.field(name), f"{self.field(name)} must be a finite number, got {value!r}")
        return float(value)

    def integer(self, name: str) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(self.field(name), f"{self.field(name)} must be an integer, got {value!r}")
        return value


@dataclass(frozen=True)
class EngineResources:
    """What the engine lends a knob's `prepare`."""

    grammars: GrammarCompiler | None = None
    """None: the engine has no tokenizer to compile a grammar for."""


class LogitsProcessor(ABC):
    """One sampling knob over a batch's logits [B, V], before temperature, from request to
    sampled token (in the spirit of vLLM v1's logits processors).

    Request side (the front end): `read` the knob's settings from the request's
    `fields` (None: not asked for), `check` them against the rest of the params. They travel
    in `GenerationParams.knobs[name]` to the engine, which `prepare`s each sample's row
    state. Batch side (the sampler): one processor per batch composition (`create`, vLLM's
    update_state) from the rows that use it, `apply` at every step, `record` the tokens
    sampled; `ends` says whether a token ends its sample. vLLM maps it through `vllm_kwargs`."""

    name: ClassVar[str]
    """Its key in `GenerationParams.knobs` and in the registry."""
    fields: ClassVar[tuple[str, ...]] = ()
    """The request fields it reads: an OpenAI request may send them although its model does
    not declare them."""
    argmax_invariant: ClassVar[bool] = False
    """True when it never changes a row's most likely token (as min-p does): an all-greedy batch
    may skip it. None of the OpenAI knobs is: a bias, a mask or a penalty can move the argmax."""

    # -- request side ----------------------------------------------------------------------

    @classmethod
    def read(cls, fields: RequestFields) -> Settings | None:
        """Its settings from the request, or None when the request leaves it off (or sets it
        to what changes nothing). A value of the wrong shape is a RequestError naming its field.
        Knobs no request field sets (a grammar comes from `response_format`) read nothing."""
        return None

    @classmethod  # noqa: B027 - most knobs' shapes are checked by `read`
    def check(cls, settings: Settings, params: SamplingParams, where: str, vocab_size: int | None) -> None:
        """Refuses, naming the field as `where.field`, settings that do not fit the request
        (its `max_tokens`) or the model (`vocab_size`)."""

    @classmethod
    def vllm_kwargs(cls, settings: Settings | None) -> dict[str, Any]:
        """Its keyword arguments of vllm.SamplingParams (settings None: the neutral ones).
        A knob vLLM has no equivalent of keeps this default: a RequestError when set."""
        if settings is None:
            return {}
        field = cls.fields[0] if cls.fields else cls.name
        raise RequestError(field, f"the vllm engine does not support {field}")

    # -- engine side -----------------------------------------------------------------------

    @classmethod
    def prepare(
        cls, settings: Settings, params: SamplingParams, resources: EngineResources
    ) -> Sequence[RowState] | None:
        """Each of the request's `params.n` samples' row state, once the engine takes it (None:
        nothing to do). By default they share the settings."""
        return [settings] * params.n

    @classmethod
    @abstractmethod
    def create(
        cls, rows: Sequence[tuple[int, RowState]], device: torch.device | str, history: History | None
    ) -> LogitsProcessor | None:
        """The processor of a batch for `rows`, (row of the batch, its state), of the rows that
        use it (None: nothing to do now)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with the knob applied (a new tensor or `logits` itself)."""

    def record(self, tokens: torch.Tensor) -> None:  # noqa: B027 - most processors keep no state
        """The tokens just sampled, one per row of the batch."""

    @staticmethod
    def ends(state: RowState, token: int) -> bool:
        """Whether `token`, just sampled by a row with this state, ends its sample (called
        for every token such a row samples that is not one of its stop tokens)."""
        return False


def token_mask(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab]: True at each row's tokens."""
    mask = torch.zeros(len(token_lists), vocab, dtype=torch.bool, device=device)
    for row, tokens in enumerate(token_lists):
        mask[row, list(tokens)] = True
    return mask


def needs_history(history: History | None) -> History:
    if history is None:
        raise ValueError("penalised and min_tokens rows need their history")
    return history
