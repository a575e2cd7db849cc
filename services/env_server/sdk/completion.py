"""One sampled continuation, as the harness sees it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """One per token: the logprob under the distribution actually sampled from."""
    finish_reason: FinishReason
    """`stop`: a stop token ended it (and is its last token); `length`: the token budget did."""
    policy_version_start: int = 0
    policy_version_end: int = 0
