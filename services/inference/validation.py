"""The request check of the OpenAI-compatible app, built on the wire's (the gRPC servicer's
requests are checked as they are converted, `rlrun.common.wire.inference`).

It raises `RequestError(field, message)` naming the offending field as the caller's protocol
spells it, so both shells answer bad input with a precise message.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlrun.common.wire.inference import check_token_ids
from rlrun.common.wire.sampling import SamplingParams


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
    context and `max_samples` (limits.max_samples)."""
    check_token_ids(prompt, prompt_field, vocab_size, max_model_len - 1)
    params.validate(
        sampling_field,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        prompt_len=len(prompt),
        max_samples=max_samples,
        samples_field=samples_field,
    )
