"""Batched sampling over one decode step's logits, with per-row settings.

Order, as in vLLM: the logit bias, the repetition penalty, the presence and frequency
penalties (these four from the OpenAI-compatible API only), then temperature, then top-k,
then top-p over what top-k kept. The logprob returned for a sampled token is log softmax(logits' / T) at that token,
with logits' the biased and penalised logits, before top-k/top-p truncation (T = 1 for
greedy rows): without bias and penalties, the distribution the trainer recomputes. Sampling uses the exponential race (argmax of log p - log E, E ~ Exp(1)),
which draws exactly from the categorical and lets seeded rows draw their own noise. Rows
that ask for `top_logprobs` also get the most likely tokens of that same distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    repetition_penalty: float = 1.0

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


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

    Penalised rows count the tokens each has generated: from `generated` (each row's tokens
    so far) on the first step, then from what this sampler samples, so every sampled token
    must be appended to its row before the sampler is rebuilt. The repetition penalty also
    reads each row's prompt (`prompts`)."""

    def __init__(
        self,
        rows: Sequence[RowSettings],
        device: torch.device | str = "cpu",
        generated: Sequence[Sequence[int]] = (),
        prompts: Sequence[Sequence[int]] = (),
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
        self.truncates = any(r.top_k > 0 or r.top_p < 1 for r in rows)
        if self.truncates:
            self.top_k = torch.tensor([r.top_k for r in rows], dtype=torch.long, device=device)
            self.top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=device)
        self.seeded = [(i, r.generator) for i, r in enumerate(rows) if r.generator is not None]
        self.top_logprobs = max((r.top_logprobs for r in rows), default=0)
        biased = [(row, token, bias) for row, r in enumerate(rows) for token, bias in r.logit_bias.items()]
        self.bias: tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        if biased:
            rows_of, tokens_of, values = zip(*biased, strict=True)
            index = (torch.tensor(rows_of, device=device), torch.tensor(tokens_of, device=device))
            self.bias = (index, torch.tensor(values, dtype=torch.float32, device=device))
        penalised = [row for row, r in enumerate(rows) if r.penalised]
        self.penalised: torch.Tensor | None = None
        if penalised:
            self.penalised = torch.tensor(penalised, device=device)
            self.presence = torch.tensor([rows[i].presence_penalty for i in penalised], device=device)[
                :, None
            ]
            self.frequency = torch.tensor([rows[i].frequency_penalty for i in penalised], device=device)[
                :, None
            ]
            self._rows = torch.arange(len(penalised), device=device)
            self._generated = [list(generated[i]) for i in penalised]
            self._counts: torch.Tensor | None = None
            """[penalised rows, V]: how often each has generated each token."""
            repetition = [rows[i].repetition_penalty for i in penalised]
            self.repetition: torch.Tensor | None = None
            if any(r != 1 for r in repetition):
                self.repetition = torch.tensor(repetition, device=device)[:, None]
                self._prompts = [prompts[i] for i in penalised]
                self._in_prompt: torch.Tensor | None = None

    def _adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with the rows' bias added and their penalties subtracted."""
        if self.bias is not None:
            index, values = self.bias
            logits = logits.index_put(index, values, accumulate=True)
        if self.penalised is not None:
            if self._counts is None:
                self._counts = torch.zeros(len(self._generated), logits.shape[-1], device=logits.device)
                rows = [row for row, tokens in enumerate(self._generated) for _ in tokens]
                self._add_counts(rows, [token for tokens in self._generated for token in tokens])
            counts = self._counts
            rows = logits.index_select(0, self.penalised)
            if self.repetition is not None:
                if self._in_prompt is None:
                    self._in_prompt = torch.zeros_like(counts, dtype=torch.bool)
                    for row, prompt in enumerate(self._prompts):
                        self._in_prompt[row, list(prompt)] = True
                factor = torch.where(rows > 0, 1 / self.repetition, self.repetition)
                rows = torch.where(self._in_prompt | (counts > 0), rows * factor, rows)
            rows = rows - counts * self.frequency - (counts > 0) * self.presence
            logits = logits.index_copy(0, self.penalised, rows)
        return logits

    def _add_counts(self, rows: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> None:
        device = self._counts.device
        index = tuple(torch.as_tensor(x, dtype=torch.long, device=device) for x in (rows, tokens))
        self._counts.index_put_(index, torch.ones(len(index[0]), device=device), accumulate=True)

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> Sampled:
        """logits [B, V] -> the sampled tokens, their logprobs, and the top logprobs asked for."""
        logits = self._adjusted(logits.float())
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
        if self.penalised is not None:
            self._add_counts(self._rows, tokens[self.penalised])
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
