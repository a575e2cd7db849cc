"""Structured outputs: the tokens a row's grammar does not allow next are masked out, and the
token that completes its value ends the sample (rlrun.inference.structured; llguidance is
loaded only once a grammar is used).

No request field sets it: the OpenAI app puts the JSON schema that `response_format` or
`tool_choice` asks for under `Grammar.name` (`rlrun.inference.openai.structured_outputs`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits.base import EngineResources, History, LogitsProcessor

if TYPE_CHECKING:
    from rlrun.inference.structured import SampleGrammar


class Grammar(LogitsProcessor):
    """Settings: the JSON schema, as text; row state: the sample's own `SampleGrammar`."""

    name = "json_schema"

    def __init__(self, rows: Sequence[tuple[int, SampleGrammar]], device: torch.device | str):
        self.grammars = [grammar for _, grammar in rows]
        self.rows = torch.tensor([row for row, _ in rows], device=device)
        self._bitmask: torch.Tensor | None = None
        """[grammar rows, mask words]: where the grammars write the tokens they allow (on the
        CPU, where llguidance writes)."""

    @classmethod
    def vllm_kwargs(cls, settings: str | None) -> dict[str, Any]:
        if settings is None:
            return {}
        from rlrun.inference.structured import COMPACT_JSON

        # llguidance, as the torch engine: it reads the compact-JSON options in the schema.
        return {"structured_outputs": {"json": json.loads(settings) | {"x-guidance": COMPACT_JSON}}}

    @classmethod
    def prepare(cls, settings: str, params: Any, resources: EngineResources) -> list[SampleGrammar]:
        if resources.grammars is None:
            raise RequestError("json_schema", "this engine has no tokenizer to follow a json_schema with")
        return [resources.grammars.sample_grammar(settings) for _ in range(params.n)]

    @classmethod
    def create(
        cls, rows: Sequence[tuple[int, SampleGrammar]], device: torch.device | str, history: History | None
    ) -> Grammar:
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

    @staticmethod
    def ends(state: SampleGrammar, token: int) -> bool:
        return state.accept(token)
