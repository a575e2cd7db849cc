"""Batched sampling over one decode step's logits, with per-row settings.

Order, as in vLLM: the logits processors of the rows that use them, in the order registered
(the logit bias, the min_tokens mask, the repetition, presence and frequency penalties, the
mask of a row's grammar: OpenAI-compatible API only, `rlrun.inference.logits`), then
temperature, then min-p,
then top-k, then top-p over what they kept. The logprob returned for a sampled token is its
logprob under the distribution it was drawn from: log softmax(logits' / T) with logits' the
biased and penalised logits, renormalised over the tokens min-p/top-k/top-p kept (what vLLM
reports as `processed_logprobs`). Without bias, penalties and truncation, that is the
distribution the trainer recomputes. Greedy rows draw from no distribution; they report the
model's own, T = 1 and untruncated (as vLLM does for a greedy batch). Sampling uses the
exponential race (argmax of log p - log E, E ~ Exp(1)), which draws exactly from the
categorical and lets seeded rows draw their own noise. Rows that ask for `top_logprobs` also
get the most likely tokens of that same distribution (a truncated token's logprob is -inf).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rlrun.inference.logits import PROCESSORS, History, LogitsProcessor
from rlrun.inference.logits.base import RowState


@dataclass(frozen=True)
class RowSettings:
    """The sampling settings of one running sequence."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    generator: torch.Generator | None = None
    """Seeded requests draw from their own generator; others from the engine's."""
    top_logprobs: int = 0
    """How many of the most likely tokens to report with their logprobs."""
    knobs: Mapping[str, RowState] = field(default_factory=dict)
    """Its state of each logits processor it uses, by name (`LogitsProcessor.prepare`; a
    grammar's is the sample's own, like `generator`). Empty for the model's own logits, as
    training asks."""


class Sampled(NamedTuple):
    tokens: torch.Tensor
    """[B] sampled token ids."""
    logprobs: torch.Tensor
    """[B] their logprobs."""
    top: tuple[torch.Tensor, torch.Tensor] | None
    """(logprobs, token ids), each [B, K] most likely first, with K the most any row asked
    for (None when no row asked)."""


class BatchSampler:
    """Sampling settings of the running batch as tensors, rebuilt only when the batch changes.
    The logits processors (rlrun.inference.logits) act on the rows that use them; a batch
    without any runs none. `history` is read only by processors that need it."""

    def __init__(
        self, rows: Sequence[RowSettings], device: torch.device | str = "cpu", history: History | None = None
    ):
        # Decided in Python, and tensors built only where rows differ: the batch changes
        # whenever a sequence joins or leaves, so this runs on most steps.
        temperatures = [r.temperature for r in rows]
        self.all_greedy = all(t == 0 for t in temperatures)
        self.any_greedy = any(t == 0 for t in temperatures)
        effective = [t if t > 0 else 1.0 for t in temperatures]
        self.scaled = any(t != 1.0 for t in effective)
        self.temperature: float | torch.Tensor = effective[0]
        if any(t != effective[0] for t in effective):
            self.temperature = torch.tensor(effective, dtype=torch.float32, device=device)[:, None]
        if self.any_greedy and not self.all_greedy:
            self.greedy = torch.tensor([t == 0 for t in temperatures], device=device)
        self.truncates = any(r.top_k > 0 or r.top_p < 1 or r.min_p > 0 for r in rows)
        if self.truncates:
            self.top_k = torch.tensor([r.top_k for r in rows], dtype=torch.long, device=device)
            self.top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=device)
            self.min_p = None
            if any(r.min_p > 0 for r in rows):
                self.min_p = torch.tensor([r.min_p for r in rows], dtype=torch.float32, device=device)
        self.seeded = [(i, r.generator) for i, r in enumerate(rows) if r.generator is not None]
        self.top_logprobs = max((r.top_logprobs for r in rows), default=0)
        adjusting = any(r.knobs for r in rows)
        self.processors: list[LogitsProcessor] = []
        if adjusting:
            for name, cls in PROCESSORS.items():
                users = [(i, r.knobs[name]) for i, r in enumerate(rows) if name in r.knobs]
                if users and (processor := cls.create(users, device, history)) is not None:
                    self.processors.append(processor)
        self.rows_alike: RowSettings | None = None
        """The settings of every row, when nothing here depends on which rows are sampled
        (no per-row tensor, seed or adjustment): the sampler then stays valid while rows that
        share them join or rows leave, as a batch does on most steps."""
        if rows and not (self.seeded or adjusting or self.truncates) and all(r == rows[0] for r in rows):
            self.rows_alike = rows[0]

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> Sampled:
        """logits [B, V] -> the sampled tokens, their logprobs, and the top logprobs asked for."""
        logits = logits.float()
        for processor in self.processors:
            if not (self.all_greedy and processor.argmax_invariant):
                logits = processor.apply(logits)
        scaled = logits / self.temperature if self.scaled else logits
        if self.truncates and not self.all_greedy:
            logprobs = torch.log_softmax(truncate(scaled, self.top_k, self.top_p, self.min_p), dim=-1)
            if self.any_greedy:
                logprobs = torch.where(self.greedy[:, None], torch.log_softmax(scaled, dim=-1), logprobs)
        else:
            logprobs = torch.log_softmax(scaled, dim=-1)
        if self.all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            noise = torch.empty_like(logprobs).exponential_(generator=generator)
            for row, row_generator in self.seeded:
                noise[row].exponential_(generator=row_generator)
            # exponential_ may return exactly 0; its log would make that token win outright
            # (and turn a truncated token's -inf into NaN, which argmax would pick).
            tokens = (logprobs - noise.clamp_(min=torch.finfo(noise.dtype).tiny).log()).argmax(dim=-1)
            if self.any_greedy:
                tokens = torch.where(self.greedy, logits.argmax(dim=-1), tokens)
        for processor in self.processors:
            processor.record(tokens)
        top = None
        if self.top_logprobs:
            top = logprobs.topk(min(self.top_logprobs, logprobs.shape[-1]), dim=-1)
        return Sampled(tokens, logprobs.gather(1, tokens[:, None])[:, 0], top)


def truncate(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits with everything below each row's min-p, then outside its top-k, then outside its
    top-p nucleus, set to -inf. top_k 0 keeps all; the most likely token always survives."""
    if min_p is not None:
        # p < min_p * p_max  <=>  logit < max logit + log(min_p); log(0) = -inf keeps all.
        floor = logits.amax(dim=-1, keepdim=True) + min_p[:, None].log()
        logits = logits.masked_fill(logits < floor, float("-inf"))
    ordered, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    ordered = ordered.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # Rows without top-p skip the mask: float rounding can push the cumulative mass past 1.
    outside = (mass_before >= top_p[:, None]) & (top_p < 1)[:, None]
    ordered = ordered.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
