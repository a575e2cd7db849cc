"""rlrun/v1/sampling.proto: the sampling settings training asks for, validated."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlrun.common.wire import WireError
from rlrun.v1 import sampling_pb2


@dataclass
class SamplingParams:
    """The sampling settings of the proto's SamplingParams (rlrun/v1/sampling.proto): what
    training asks. The OpenAI-compatible API's own (min_p, logprobs, penalties, logit bias,
    structured outputs, ...) live in the inference service: `rlrun.inference.params`."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    n: int = 1

    def with_stop_tokens(self, stop_token_ids: Sequence[int]) -> SamplingParams:
        """These settings with `stop_token_ids` among the stop tokens (after its own, once each):
        how a chat format's end-of-message tokens join a request's."""
        merged = list(self.stop_token_ids) + [t for t in stop_token_ids if t not in self.stop_token_ids]
        return dataclasses.replace(self, stop_token_ids=merged)

    def validate(
        self,
        where: str = "sampling",
        *,
        vocab_size: int | None = None,
        max_model_len: int | None = None,
        prompt_len: int | None = None,
        max_samples: int | None = None,
        samples_field: str = "n",
    ) -> None:
        """`max_samples`: the most samples one request may ask for (limits.max_samples, at
        most what the engine's queue can hold, so that a retry would not help either);
        `samples_field`: the request's field that asked for them (OpenAI's `best_of` draws
        more samples than its `n`)."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise WireError(
                f"{where}.temperature",
                f"{where}.temperature must be a finite number >= 0, got {self.temperature}",
            )
        if not (0 < self.top_p <= 1):
            raise WireError(f"{where}.top_p", f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise WireError(f"{where}.top_k", f"{where}.top_k must be >= 0, got {self.top_k}")
        if self.max_tokens <= 0:
            raise WireError(
                f"{where}.max_tokens", f"{where}.max_tokens must be positive, got {self.max_tokens}"
            )
        if self.n < 1:
            raise WireError(f"{where}.n", f"{where}.n must be >= 1, got {self.n}")
        if max_samples is not None and self.n > max_samples:
            raise WireError(
                f"{where}.{samples_field}",
                f"{where}.{samples_field} = {self.n} samples exceed the limit limits.max_samples = "
                f"{max_samples}",
            )
        if vocab_size is not None:
            if len(self.stop_token_ids) > vocab_size:
                raise WireError(
                    f"{where}.stop_token_ids",
                    f"{where}.stop_token_ids has {len(self.stop_token_ids)} entries, more than the "
                    f"vocabulary's {vocab_size} tokens",
                )
            for i, tok in enumerate(self.stop_token_ids):
                if not 0 <= tok < vocab_size:
                    raise WireError(
                        f"{where}.stop_token_ids[{i}]",
                        f"{where}.stop_token_ids[{i}] = {tok} is outside the vocabulary [0, {vocab_size})",
                    )
        if max_model_len is not None:
            budget = max_model_len - (prompt_len or 0)
            if self.max_tokens > budget:
                raise WireError(
                    f"{where}.max_tokens",
                    f"{where}.max_tokens = {self.max_tokens} exceeds the context: "
                    f"{prompt_len or 0} prompt tokens + max_tokens must be <= {max_model_len}",
                )


def sampling_to_proto(params: SamplingParams) -> sampling_pb2.SamplingParams:
    msg = sampling_pb2.SamplingParams(
        temperature=params.temperature,
        max_tokens=params.max_tokens,
        stop_token_ids=params.stop_token_ids,
        n=params.n,
    )
    if params.top_p != 1.0:
        msg.top_p = params.top_p
    if params.top_k:
        msg.top_k = params.top_k
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def sampling_from_proto(
    msg: sampling_pb2.SamplingParams,
    where: str = "sampling",
    *,
    vocab_size: int | None = None,
    max_model_len: int | None = None,
    prompt_len: int | None = None,
    max_samples: int | None = None,
) -> SamplingParams:
    params = SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        top_k=msg.top_k if msg.HasField("top_k") else 0,
        max_tokens=msg.max_tokens,
        stop_token_ids=list(msg.stop_token_ids),
        seed=msg.seed if msg.HasField("seed") else None,
        n=msg.n or 1,
    )
    params.validate(
        where,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        prompt_len=prompt_len,
        max_samples=max_samples,
    )
    return params
