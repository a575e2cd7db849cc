"""Shared by opd and opsd: per-token advantages from how much more (or less) likely a reference
finds each sampled token than the policy that sampled it.

For every sampled token t of a branch, A_t = coef * (log p_ref(t) - log mu(t)), where mu is the
sampling-time logprob the trace carries: the per-token reverse-KL signal of on-policy
distillation. The reference scores the branch (optionally behind a context prefix) at the
sampling temperature, so both logprobs refer to the same tempered distribution.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlrun.common.wire.trace import Trace
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import Scorer, add_credit


def delta_values(
    sampled: list[bool], logprobs: list[float], reference: list[float], first: int, coef: float
) -> list[float]:
    """`reference` holds one logprob per branch token from index `first` on."""
    if len(reference) != len(sampled) - first:
        raise ValueError(
            f"the reference returned {len(reference)} logprobs for {len(sampled) - first} scored tokens"
        )
    return [coef * (reference[i - first] - logprobs[i]) if s else 0.0 for i, s in enumerate(sampled)]


async def credit_logprob_deltas(
    group: RolloutGroup, scorer: Scorer, coef: float, prefix: Callable[[Trace], list[int]]
) -> None:
    """Scores every branch with sampled tokens concurrently (the scorer caps concurrency) and
    writes the deltas into the rl channel; branches without sampled tokens get nothing."""
    jobs = []
    for trace in group.trained_traces:
        nodes = trace.node_map()
        context = prefix(trace)
        temperature = group.temperatures[trace.member_id]
        for branch_index, branch in enumerate(trace.branches):
            tokens = trace.branch_tokens(branch_index, nodes)
            if not any(tokens.sampled_mask):
                continue
            first = tokens.sampled_mask.index(True)
            start = len(context) + first
            if start < 1:
                raise ValueError(
                    f"trace {trace.id!r} branch {branch_index}: its first token is sampled, so there is no context to score it"
                )
            jobs.append((branch, tokens, first, scorer.score(context + tokens.token_ids, start, temperature)))
    scores = await asyncio.gather(*(job[3] for job in jobs))
    for (branch, tokens, first, _), reference in zip(jobs, scores, strict=True):
        values = delta_values(tokens.sampled_mask, tokens.logprobs, reference, first, coef)
        add_credit(branch, "rl", values, tokens.sampled_mask)
