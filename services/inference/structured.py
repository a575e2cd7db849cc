"""Samples constrained to a JSON schema (structured outputs), with llguidance.

A constrained sample may draw, at each step, only the tokens that keep its text a prefix of a
JSON value matching the schema, and it ends (finish_reason "stop") with the token that
completes the value. The tokens it may not draw are out of the distribution it is sampled
from, so out of its logprobs too, as with vLLM's structured outputs. The JSON is written
compact, as `json.dumps` writes it (", " and ": " between items, no other whitespace): a
model may not pad it with whitespace until it runs out of tokens.

The OpenAI-compatible API asks for it with `response_format` (json_object, json_schema) and
with `tool_choice` "required" or a named function; the `json_schema` knob carries the
schema to the engine. The grammar is compiled once per request here, in the front end (a bad
schema is a 400 naming its field), and once per sample in the engine, whose sampler masks
the logits of constrained rows (`SampleGrammar`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from rlrun.common.config import RunConfig
from rlrun.common.errors import RequestError
from rlrun.common.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger(__name__)


def _llg():
    """llguidance, imported only once a grammar is used (a server that never sees a schema
    never loads it)."""
    import llguidance

    return llguidance


COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options: the separators `json.dumps` writes, and no other whitespace."""

_SPECIAL = b"\xff"
"""How llguidance tells a special token's bytes from text: it never matches any grammar."""


def schema_text(schema: Any, field: str) -> str:
    """A JSON schema (an object) as the text the `json_schema` knob carries, checked: a
    schema llguidance cannot compile is a RequestError naming `field`."""
    if not isinstance(schema, dict):
        raise RequestError(field, f"{field} must be a JSON schema (an object), got {json.dumps(schema)}")
    text = json.dumps(schema)
    try:
        error = _llg().LLMatcher.validate_grammar(grammar(text))
    except ValueError as raised:
        error = str(raised)
    if error:
        raise RequestError(field, f"{field} is not a JSON schema this server can follow: {error}")
    return text


def grammar(schema: str) -> str:
    """llguidance's grammar of the compact JSON values that match `schema` (JSON text)."""
    return _llg().LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT_JSON)


class _CharTokens:
    """A char tokenizer as llguidance's `TokenizerWrapper` reads one."""

    def __init__(self, tokenizer: CharTokenizer):
        specials = set(range(len(tokenizer.specials)))
        self.tokens = [
            _SPECIAL + text.encode() if index in specials else text.encode()
            for index, text in enumerate(tokenizer.id_to_token)
        ]
        self.special_token_ids = sorted(specials)
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = None
        self._ids = tokenizer.token_to_id

    def __call__(self, text: bytes) -> list[int]:
        """The tokens of the longest prefix of `text` the alphabet can write (not the unknown
        character's token, which llguidance would take for the text it stands for)."""
        ids = []
        for char in text.decode():
            if char not in self._ids:
                break
            ids.append(self._ids[char])
        return ids


def grammar_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The model's tokenizer as llguidance sees it, with its stop tokens as the end."""
    if isinstance(tokenizer, CharTokenizer):
        wrapped = _llg().TokenizerWrapper(_CharTokens(tokenizer))
        return _llg().LLTokenizer(wrapped, eos_token=list(tokenizer.stop_token_ids))
    if isinstance(tokenizer, HFTokenizer):
        from llguidance.hf import from_tokenizer

        return from_tokenizer(tokenizer.hf_tokenizer, eos_token=list(tokenizer.stop_token_ids))
    raise TypeError(f"structured outputs do not know the tokenizer {type(tokenizer).__name__}")


class SampleGrammar:
    """One sample's place in its grammar: which tokens it may draw next, and whether the
    tokens it drew have completed the value."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int):
        self._matcher = matcher
        self.mask_words = (vocab + 31) // 32
        """The int32 words of its masks: one bit per token id of its tokenizer."""

    def fill_mask(self, row: torch.Tensor) -> None:
        """Writes the tokens allowed next into `row`, a contiguous int32 bitmask of
        `mask_words` words (bit i of word w: token 32 w + i)."""
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token: int) -> bool:
        """Takes the token drawn; True once nothing may follow: the value is complete, or the
        tokenizer cannot write what the schema asks next (its masks then allow only the end)."""
        if not self._matcher.consume_token(token):
            log.warning("a constrained sample ends early: %s", self._matcher.get_error().splitlines()[0])
            return True
        return self._matcher.is_stopped()

    def dead_end(self) -> bool:
        """Whether the tokenizer cannot write what the schema asks next."""
        return self._matcher.is_error()


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 bitmasks -> [rows, vocab] bools (ids past the tokenizer's: False)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask[:, :, None] >> shifts) & 1).flatten(1).bool()
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    return torch.nn.functional.pad(bits, (0, vocab - bits.shape[1]))


class GrammarCompiler:
    """The engine's grammars: a `SampleGrammar` per constrained sample, for the tokenizer
    `load_tokenizer` returns (loaded on the first constrained request, so that an engine that
    never gets one never loads it)."""

    def __init__(self, load_tokenizer: Callable[[], Tokenizer]):
        self._load_tokenizer = load_tokenizer

    @cached_property
    def tokenizer(self) -> llguidance.LLTokenizer:
        return grammar_tokenizer(self._load_tokenizer())

    def sample_grammar(self, schema: str) -> SampleGrammar:
        # Errors are the caller's to report (`dead_end`, `accept`): not llguidance's to print.
        matcher = _llg().LLMatcher(self.tokenizer, grammar(schema), log_level=0)
        if matcher.is_error():
            raise RequestError("json_schema", f"json_schema cannot be followed: {matcher.get_error()}")
        return SampleGrammar(matcher, self.tokenizer.vocab_size)

    def check_writable(self, schema: str, field: str) -> None:
        """A RequestError naming `field` when the tokenizer cannot even begin such a value."""
        sample = self.sample_grammar(schema)
        sample.fill_mask(torch.empty(sample.mask_words, dtype=torch.int32))
        if sample.dead_end():
            raise RequestError(field, f"the model's tokenizer cannot write the JSON that {field} asks for")


def model_grammars(config: RunConfig) -> GrammarCompiler:
    """The grammars of the model `config` serves, over its tokenizer."""
    return GrammarCompiler(lambda: load_tokenizer(config.model.tokenizer, config.model.path))
