"""Batched sampling over one decode step's logits, with per-row settings.

Order, as in transformers and vLLM: temperature, then top-k, then top-p over what top-k
kept. The logprob returned for a sampled token is log softmax(logits / T) at that token,
before top-k/top-p truncation (T = 1 for greedy rows): the distribution the trainer
recomputes. Sampling uses the exponential race (argmax of log p - log E, E ~ Exp(1)),
which draws exactly from the categorical and lets seeded rows draw their own noise. Rows
that ask for `top_logprobs` also get the most likely tokens of that same distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class RowSettings:
    """The sampling settings of one running sequence."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    """Seeded requests draw from their own generator; others from the engine's."""
    top_logprobs: int = 0
    """How many of the most likely tokens to report with their logprobs."""


class Sampled(NamedTuple):
    tokens: torch.Tensor
    """[B] sampled token ids."""
    logprobs: torch.Tensor
    """[B] their logprobs."""
    top: tuple[torch.Tensor, torch.Tensor] | None
    """(logprobs, token ids), each [B, K] most likely first, with K the most any row asked
    for (None when no row asked)."""


class BatchSampler:
    """Sampling settings of the running batch as tensors, rebuilt only when the batch changes."""

    def __init__(self, rows: Sequence[RowSettings], device: torch.device | str = "cpu"):
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
        self.truncates = any(r.top_k > 0 or r.top_p < 1 for r in rows)
        if self.truncates:
            self.top_k = torch.tensor([r.top_k for r in rows], dtype=torch.long, device=device)
            self.top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=device)
        self.seeded = [(i, r.generator) for i, r in enumerate(rows) if r.generator is not None]
        self.top_logprobs = max((r.top_logprobs for r in rows), default=0)

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> Sampled:
        """logits [B, V] -> the sampled tokens, their logprobs, and the top logprobs asked for."""
        logits = logits.float()
        scaled = logits / self.temperature if self.scaled else logits
        logprobs = torch.log_softmax(scaled, dim=-1)
        if self.all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            candidates = truncate(scaled, self.top_k, self.top_p) if self.truncates else logprobs
            noise = torch.empty_like(candidates).exponential_(generator=generator)
            for row, row_generator in self.seeded:
                noise[row].exponential_(generator=row_generator)
            # exponential_ may return exactly 0; its log would make that token win outright
            # (and turn a truncated token's -inf into NaN, which argmax would pick).
            tokens = (candidates - noise.clamp_(min=torch.finfo(noise.dtype).tiny).log()).argmax(dim=-1)
            if self.any_greedy:
                tokens = torch.where(self.greedy, logits.argmax(dim=-1), tokens)
        top = None
        if self.top_logprobs:
            top = logprobs.topk(min(self.top_logprobs, logprobs.shape[-1]), dim=-1)
        return Sampled(tokens, logprobs.gather(1, tokens[:, None])[:, 0], top)


def truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits with everything outside each row's top-k, then top-p nucleus, set to -inf.
    top_k 0 keeps all; the most likely token always survives."""
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
