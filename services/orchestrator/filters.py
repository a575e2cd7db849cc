"""Rollout filters: flag degenerate rollouts. A flagged rollout always counts in the metrics; it
never trains when its filter enforces, and is only counted when the filter monitors.

- gibberish: a sampled token with an id above `token_id_above` (a rare token, in a
  frequency-ordered vocabulary) drawn with logprob < -log(vocab_size) - `logprob_offset`,
  i.e. far less likely than uniform.
- repetition: `window` consecutive sampled tokens, each with logprob > `logprob_above`
  (near-certain): a degenerate loop. Tokens the model did not sample neither extend nor break
  the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlrun.common.config import FiltersConfig
from rlrun.common.types import Trace


@dataclass(frozen=True)
class FilterHit:
    name: str
    enforced: bool


def is_gibberish(trace: Trace, vocab_size: int, token_id_above: int, logprob_offset: float) -> bool:
    threshold = -math.log(vocab_size) - logprob_offset
    for node in trace.nodes:
        if not node.logprobs or min(node.logprobs) >= threshold:
            continue
        sampled = [token for token, s in zip(node.token_ids, node.sampled_mask, strict=True) if s]
        if any(
            lp < threshold and token > token_id_above
            for token, lp in zip(sampled, node.logprobs, strict=True)
        ):
            return True
    return False


def has_repetition(trace: Trace, window: int, logprob_above: float) -> bool:
    run = 0
    for node in trace.nodes:
        if not node.logprobs:
            continue
        if max(node.logprobs) <= logprob_above:
            run = 0
            continue
        for logprob in node.logprobs:
            run = run + 1 if logprob > logprob_above else 0
            if run >= window:
                return True
    return False


class RolloutFilters:
    def __init__(self, config: FiltersConfig, vocab_size: int | None):
        if config.gibberish.enabled and vocab_size is None:
            raise ValueError("the gibberish filter needs the model's vocab_size")
        self.config = config
        self.vocab_size = vocab_size

    @property
    def names(self) -> list[str]:
        return [name for name in ("gibberish", "repetition") if getattr(self.config, name).enabled]

    def check(self, trace: Trace) -> list[FilterHit]:
        hits = []
        gibberish, repetition = self.config.gibberish, self.config.repetition
        if gibberish.enabled and is_gibberish(
            trace, self.vocab_size, gibberish.token_id_above, gibberish.logprob_offset
        ):
            hits.append(FilterHit("gibberish", gibberish.enforce))
        if repetition.enabled and has_repetition(trace, repetition.window, repetition.logprob_above):
            hits.append(FilterHit("repetition", repetition.enforce))
        return hits
