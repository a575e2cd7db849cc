"""Batched sampling over one decode step's logits, with per-row settings.

Order, as in vLLM: the logit bias, the repetition penalty, the presence and frequency
penalties, the mask of a row's grammar (these five from the OpenAI-compatible API only:
`rlrun.inference.structured`), then temperature, then min-p,
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rlrun.inference.structured import SampleGrammar, allowed_tokens


@dataclass(frozen=True)
class LogitAdjustments:
    """What a row changes in its logits before temperature (OpenAI's API only)."""

    logit_bias: Mapping[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    """Masked out until the row has generated `min_tokens` tokens."""

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


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
    adjustments: LogitAdjustments | None = None
    """None for the model's own logits, as training asks."""
    grammar: SampleGrammar | None = None
    """The sample's place in the grammar its text must follow (its own, like `generator`)."""


History = Callable[[int], tuple[Sequence[int], Sequence[int]]]
"""Row -> (its prompt, the tokens it has generated so far)."""


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
    `history` is read only for rows that adjust their logits (`LogitAdjuster`)."""

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
        adjusting = [(i, r.adjustments) for i, r in enumerate(rows) if r.adjustments is not None]
        self.adjuster = LogitAdjuster(adjusting, device, history) if adjusting else None
        self.grammars = [r.grammar for r in rows if r.grammar is not None]
        if self.grammars:
            self.grammar_rows = torch.tensor(
                [i for i, r in enumerate(rows) if r.grammar is not None], device=device
            )
            self._bitmask: torch.Tensor | None = None
            """[grammar rows, mask words]: where the grammars write the tokens they allow (on
            the CPU, where llguidance writes)."""
        self.rows_alike: RowSettings | None = None
        """The settings of every row, when nothing here depends on which rows are sampled
        (no per-row tensor, seed or adjustment): the sampler then stays valid while rows that
        share them join or rows leave, as a batch does on most steps."""
        if (
            rows
            and not (self.seeded or adjusting or self.truncates or self.grammars)
            and all(r == rows[0] for r in rows)
        ):
            self.rows_alike = rows[0]

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None) -> Sampled:
        """logits [B, V] -> the sampled tokens, their logprobs, and the top logprobs asked for."""
        logits = logits.float()
        if self.adjuster is not None:
            logits = self.adjuster.adjust(logits)
        if self.grammars:
            logits = self._follow_grammars(logits)
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
        if self.adjuster is not None:
            self.adjuster.record(tokens)
        top = None
        if self.top_logprobs:
            top = logprobs.topk(min(self.top_logprobs, logprobs.shape[-1]), dim=-1)
        return Sampled(tokens, logprobs.gather(1, tokens[:, None])[:, 0], top)

    def _follow_grammars(self, logits: torch.Tensor) -> torch.Tensor:
        """-inf for every token a grammar row may not draw next."""
        if self._bitmask is None:
            words = self.grammars[0].mask_words
            self._bitmask = torch.empty(len(self.grammars), words, dtype=torch.int32)
        for row, grammar in enumerate(self.grammars):
            grammar.fill_mask(self._bitmask[row])
        allowed = allowed_tokens(self._bitmask.to(logits.device), logits.shape[-1])
        rows = logits.index_select(0, self.grammar_rows).masked_fill(~allowed, float("-inf"))
        return logits.index_copy(0, self.grammar_rows, rows)


class LogitAdjuster:
    """The logit bias, the min_tokens mask and the penalties of the rows that have them, in
    vLLM's order: the bias and the mask of the stop tokens (for a row that has generated fewer
    than its min_tokens), then the repetition penalty (over the prompt and the tokens generated
    so far), then the presence and frequency penalties (over the tokens generated so far).

    Penalised and min_tokens rows count the tokens each has generated: from `history` on the
    first step, then from what is sampled (`record`), so every sampled token must be appended
    to its row before the batch's sampler is rebuilt."""

    def __init__(
        self,
        rows: Sequence[tuple[int, LogitAdjustments]],
        device: torch.device | str,
        history: History | None,
    ):
        if history is None and any(a.penalised or a.min_tokens for _, a in rows):
            raise ValueError("penalised and min_tokens rows need their history")
        biased = [(row, token, bias) for row, a in rows for token, bias in a.logit_bias.items()]
        self.bias: tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        if biased:
            rows_of, tokens_of, values = zip(*biased, strict=True)
            index = (torch.tensor(rows_of, device=device), torch.tensor(tokens_of, device=device))
            self.bias = (index, torch.tensor(values, dtype=torch.float32, device=device))
        held = [(row, a) for row, a in rows if a.stop_token_ids and a.min_tokens > len(history(row)[1])]
        self.held: torch.Tensor | None = None
        """The rows whose stop tokens are masked out for now."""
        if held:
            self.held = torch.tensor([row for row, _ in held], device=device)
            self._held_stops = [a.stop_token_ids for _, a in held]
            self._held_mask: torch.Tensor | None = None
            self._tokens_left = torch.tensor(
                [a.min_tokens - len(history(row)[1]) for row, a in held], device=device
            )
        penalised = [(row, a) for row, a in rows if a.penalised]
        self.penalised: torch.Tensor | None = None
        if not penalised:
            return
        self.penalised = torch.tensor([row for row, _ in penalised], device=device)
        self.presence = torch.tensor([a.presence_penalty for _, a in penalised], device=device)[:, None]
        self.frequency = torch.tensor([a.frequency_penalty for _, a in penalised], device=device)[:, None]
        self.repetition: torch.Tensor | None = None
        if any(a.repetition_penalty != 1 for _, a in penalised):
            self.repetition = torch.tensor([a.repetition_penalty for _, a in penalised], device=device)[
                :, None
            ]
        # The generated tokens as they are now: the rows append to them after each step.
        self._histories = [
            (prompt, list(generated)) for prompt, generated in (history(r) for r, _ in penalised)
        ]
        self._rows = torch.arange(len(penalised), device=device)
        self._counts: torch.Tensor | None = None
        """[penalised rows, V]: how often each has generated each token."""
        self._in_prompt: torch.Tensor | None = None
        """[penalised rows, V]: the tokens of each one's prompt (with a repetition penalty)."""

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            index, values = self.bias
            logits = logits.index_put(index, values, accumulate=True)
        if self.held is not None:
            if self._held_mask is None:
                self._held_mask = _token_mask(self._held_stops, logits.shape[-1], logits.device)
            masked = self._held_mask & (self._tokens_left > 0)[:, None]
            rows = logits.index_select(0, self.held).masked_fill(masked, float("-inf"))
            logits = logits.index_copy(0, self.held, rows)
        if self.penalised is None:
            return logits
        if self._counts is None:
            self._start(logits.shape[-1], logits.device)
        counts = self._counts
        rows = logits.index_select(0, self.penalised)
        if self.repetition is not None:
            factor = torch.where(rows > 0, 1 / self.repetition, self.repetition)
            rows = torch.where(self._in_prompt | (counts > 0), rows * factor, rows)
        rows = rows - counts * self.frequency - (counts > 0) * self.presence
        return logits.index_copy(0, self.penalised, rows)

    def record(self, tokens: torch.Tensor) -> None:
        """Counts the tokens just sampled (one per row of the batch)."""
        if self.held is not None:
            self._tokens_left -= 1
        if self.penalised is not None:
            self._count(self._rows, tokens[self.penalised])

    def _start(self, vocab: int, device: torch.device) -> None:
        self._counts = torch.zeros(len(self._histories), vocab, device=device)
        generated = [tokens for _, tokens in self._histories]
        self._count(
            [row for row, tokens in enumerate(generated) for _ in tokens], [t for ts in generated for t in ts]
        )
        if self.repetition is not None:
            self._in_prompt = _token_mask([prompt for prompt, _ in self._histories], vocab, device)

    def _count(self, rows: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> None:
        device = self._counts.device
        index = tuple(torch.as_tensor(x, dtype=torch.long, device=device) for x in (rows, tokens))
        self._counts.index_put_(index, torch.ones(len(index[0]), device=device), accumulate=True)


def _token_mask(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab]: True at each row's tokens."""
    mask = torch.zeros(len(token_lists), vocab, dtype=torch.bool, device=device)
    for row, tokens in enumerate(token_lists):
        mask[row, list(tokens)] = True
    return mask


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
