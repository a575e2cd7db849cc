"""The most work one request may ask of a service, as every servicer checks it: resolved from
the run file's `[limits]` (rlrun.common.config.limits derives each unset one)."""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.common.wire import WireError


@dataclass(frozen=True)
class RequestLimits:
    max_group_size: int
    """RunGroup's `n`; RunAlgorithms' traces per member."""
    max_samples: int
    """Samples of one generation request (gRPC `sampling.n`; OpenAI prompts x n)."""
    max_messages: int
    """Messages of one chat request."""
    max_text_chars: int
    """Characters of one text field."""
    max_batch_samples: int
    """Samples of one SubmitBatch."""

    def check(self, field: str, count: int, name: str, what: str) -> None:
        """A WireError naming `field`, the limit and the setting that raises it when `count`
        (of `what`, e.g. "rollouts") exceeds limit `name`."""
        limit = getattr(self, name)
        if count > limit:
            raise WireError(field, f"{count} {what} exceed the limit limits.{name} = {limit}")
