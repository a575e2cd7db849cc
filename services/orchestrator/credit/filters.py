"""Rollout filters: flag degenerate rollouts. A flagged rollout always counts in the metrics; it
never trains when its filter enforces, and is only counted when the filter monitors.

- gibberish: a sampled token with an id above `token_id_above` (a rare token, in a
  frequency-ordered vocabulary) drawn with logprob < -log(vocab_size) - `logprob_offset`,
  i.e. far less likely than uniform.
- repetition: `window` consecutive sampled tokens, each with logprob > `logprob_above`
  (near-certain): a degenerate loop. Tokens the model did not sample neither extend nor break
  the run.
- out_of_vocabulary: always on and enforced. A token id the model has no embedding for (an env
  that tokenized with another tokenizer, a corrupted trace) would crash the trainer's embedding
  lookup, so it must never reach the trainer. Only the trace is kept from training, not its
  group: the group's other rollouts are intact and already credited, and the trace's reward
  is still a valid score of its rollout (the env computed it from the text), so it stays in the
  group's baseline and in the metrics like any other flagged rollout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlrun.common.config import FiltersConfig
from rlrun.common.wire.trace import Trace

OUT_OF_VOCABULARY = "out_of_vocabulary"


@dataclass(frozen=True)
class FilterHit:
    name: str
    enforced: bool
    detail: str = ""
    """What exactly broke the filter, where the filter can name a field."""


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


def out_of_vocabulary(trace: Trace, vocab_size: int) -> str | None:
    """The first token id at or above `vocab_size`, as `nodes[i].token_ids[j] = id`; None when
    every id is in the vocabulary (negative ids never get here: the wire contract refuses them)."""
    for i, node in enumerate(trace.nodes):
        if node.token_ids and max(node.token_ids) >= vocab_size:
            j = next(j for j, token in enumerate(node.token_ids) if token >= vocab_size)
            return f"nodes[{i}].token_ids[{j}] = {node.token_ids[j]}"
    return None


class RolloutFilters:
    def __init__(self, config: FiltersConfig, vocab_size: int):
        self.config = config
        self.vocab_size = vocab_size

    @property
    def names(self) -> list[str]:
        return [name for name in ("gibberish", "repetition") if getattr(self.config, name).enabled]

    def check(self, trace: Trace) -> list[FilterHit]:
        hits = []
        field = out_of_vocabulary(trace, self.vocab_size)
        if field is not None:
            detail = f"{field} is outside the model's vocabulary (vocab_size {self.vocab_size})"
            hits.append(FilterHit(OUT_OF_VOCABULARY, enforced=True, detail=detail))
        gibberish, repetition = self.config.gibberish, self.config.repetition
        if gibberish.enabled and is_gibberish(
            trace, self.vocab_size, gibberish.token_id_above, gibberish.logprob_offset
        ):
            hits.append(FilterHit("gibberish", gibberish.enforce))
        if repetition.enabled and has_repetition(trace, repetition.window, repetition.logprob_above):
            hits.append(FilterHit("repetition", repetition.enforce))
        return hits
