"""Request checks shared by the gRPC servicer and the OpenAI-compatible app.

Each raises `RequestError(field, message)` naming the offending field as the caller's
protocol spells it, so both shells answer bad input with a precise message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlrun.common.errors import RequestError
from rlrun.common.wire.sampling import SamplingParams


def check_token_ids(token_ids: Sequence[int], field: str, vocab_size: int, max_len: int) -> None:
    """Non-empty, every id in [0, vocab_size), at most `max_len` ids."""
    if len(token_ids) == 0:
        raise RequestError(field, f"{field} must not be empty")
    if len(token_ids) > max_len:
        raise RequestError(field, f"{field} has {len(token_ids)} tokens; the context holds {max_len}")
    for i, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise RequestError(
                f"{field}[{i}]", f"{field}[{i}] = {token} is outside the vocabulary [0, {vocab_size})"
            )


def check_generate(
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    max_samples: int | None = None,
    prompt_field: str = "prompt_token_ids",
    sampling_field: str = "sampling",
    samples_field: str = "n",
) -> None:
    """A prompt that leaves room for at least one token, and sampling settings that fit the
    context and the engine's queue (`Engine.max_samples`)."""
    check_token_ids(prompt, prompt_field, vocab_size, max_model_len - 1)
    params.validate(
        sampling_field,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        prompt_len=len(prompt),
        max_samples=max_samples,
        samples_field=samples_field,
    )


def check_score(
    token_ids: Sequence[int], start: int, temperature: float, *, vocab_size: int, max_model_len: int
) -> None:
    check_token_ids(token_ids, "token_ids", vocab_size, max_model_len)
    if not 1 <= start < len(token_ids):
        raise RequestError(
            "start", f"start must be in [1, {len(token_ids)}) for {len(token_ids)} tokens, got {start}"
        )
    if not math.isfinite(temperature) or temperature < 0:
        raise RequestError("temperature", f"temperature must be a finite number >= 0, got {temperature}")
