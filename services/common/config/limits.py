"""[limits]: the most work one request may ask of a service.

Every request that sizes work (how many rollouts, samples, messages, characters, training
samples) is checked against these before any work starts; a request over a limit gets
INVALID_ARGUMENT (gRPC) or 400 (HTTP) naming the field and the limit. Each limit left unset
is derived from the rest of the run file: what this run could ever ask for, times
`LIMIT_MARGIN`, so a run never meets its own limits while a stray or hostile request cannot
make a service do unbounded work. `RunConfig.request_limits()` resolves them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from rlrun.common.config.base import Section
from rlrun.common.wire.limits import RequestLimits

if TYPE_CHECKING:
    from rlrun.common.config.run import RunConfig

LIMIT_MARGIN = 4
"""How far a derived limit lies above what the run itself asks for."""
CHARS_PER_TOKEN = 32
"""Characters a text may hold per token of the context: well above what any tokenizer packs
into a token on average, so that only a text that could never fit is refused unread."""


class LimitsConfig(Section):
    max_group_size: int | None = Field(None, ge=1)
    """Most rollouts one RunGroup may ask for (`n`; a multi-agent env returns n traces per
    member), and most traces per member one RunAlgorithms may carry. Default: unset, i.e.
    4 x the largest group the run asks for (orchestrator.group_size, orchestrator.eval.pass_k)."""

    max_samples: int | None = Field(None, ge=1)
    """Most samples one generation request may ask for: `sampling.n` of Generate and
    GenerateChat, and the prompts x `n` (or `best_of`) of an OpenAI request. At most
    inference.max_waiting (a request the queue could never hold). Default: unset, i.e. 4 x the
    larger of the largest group and inference.max_batch_size, capped at inference.max_waiting."""

    max_messages: int | None = Field(None, ge=1)
    """Most messages of one chat request (GenerateChat, RenderChat, /v1/chat/completions).
    Default: unset, i.e. model.max_model_len (every message renders to at least one token)."""

    max_text_chars: int | None = Field(None, ge=1)
    """Most characters of one text: Tokenize's text, a chat message's content, a completion
    prompt, a stop sequence, the tools of a chat request. Default: unset, i.e.
    32 x model.max_model_len."""

    max_batch_samples: int | None = Field(None, ge=1)
    """Most samples of one SubmitBatch. Default: unset, i.e. 4 x the largest batch the run
    submits (orchestrator.batch_size x group_size, orchestrator.warm_start.batch_size)."""


def resolve_limits(config: RunConfig) -> RequestLimits:
    # Each key read by its full path: the operator hashes exactly these into every pod template
    # (rlrun.operator.builder.CONFIG_READS; tests/operator/test_reconcile.py scans for them).
    largest_group = max(config.orchestrator.group_size, config.orchestrator.eval.pass_k)
    largest_batch = max(
        config.orchestrator.batch_size * config.orchestrator.group_size,
        config.orchestrator.warm_start.batch_size,
    )
    set_ = config.limits
    derived_samples = min(
        config.inference.max_waiting, LIMIT_MARGIN * max(largest_group, config.inference.max_batch_size)
    )
    return RequestLimits(
        max_group_size=set_.max_group_size or LIMIT_MARGIN * largest_group,
        max_samples=set_.max_samples or derived_samples,
        max_messages=set_.max_messages or config.model.max_model_len,
        max_text_chars=set_.max_text_chars or CHARS_PER_TOKEN * config.model.max_model_len,
        max_batch_samples=set_.max_batch_samples or LIMIT_MARGIN * largest_batch,
    )
