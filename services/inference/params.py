"""What an engine samples with: the wire's `SamplingParams` (all that training asks, and all
the gRPC API carries) plus what only the OpenAI-compatible APIs set.

The trainer recomputes the model's own distribution, so tokens drawn from another (biased,
penalised, masked) would only be masked as off-policy: the proto has none of these, and
`rlrun.common.wire.sampling` knows none of them. Engines take either type (`GenerationParams.of`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rlrun.common.wire import WireError
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.logits import check_knobs

MAX_TOP_LOGPROBS = 20
"""The most alternatives a request may ask for per position (OpenAI's limit)."""


@dataclass
class GenerationParams(SamplingParams):
    min_p: float = 0.0
    """vLLM's: tokens less likely than min_p times the most likely one (after temperature) are
    never drawn, before top-k and top-p (0: off)."""
    top_logprobs: int = 0
    """How many of the most likely tokens to report, with their logprobs, at each generated
    position (at most MAX_TOP_LOGPROBS)."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """The settings of each logits processor the request asks for, by its name
    (`rlrun.inference.logits`): they change the logits before temperature, so the
    distribution sampled from (and the logprobs returned) is no longer the model's."""

    @classmethod
    def of(cls, params: SamplingParams) -> GenerationParams:
        """`params` as an engine reads them (those of the gRPC API: no OpenAI knob)."""
        if isinstance(params, cls):
            return params
        return cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(SamplingParams)})

    def validate(self, where: str = "sampling", **limits: Any) -> None:
        """SamplingParams' checks (`limits` as it takes them), then the OpenAI-side fields'."""
        super().validate(where, **limits)
        if not (math.isfinite(self.min_p) and 0 <= self.min_p <= 1):
            raise WireError(f"{where}.min_p", f"{where}.min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise WireError(
                f"{where}.top_logprobs",
                f"{where}.top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}",
            )
        check_knobs(self.knobs, self, where, limits.get("vocab_size"))
