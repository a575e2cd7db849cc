"""Env-owned algorithms: per-branch advantages and masks an environment computes itself.

The orchestrator sends a group's traces back through RunAlgorithms, with each algorithm's
settings (the run's `orchestrator.algorithm_args.<id>`) and the model endpoints the run has
(`policy` and every key of `[orchestrator.models]`, e.g. `reference`); the env-server runs the
named algorithms and returns one BranchResult per branch they touched.

An algorithm is `f(traces)` or `f(traces, context)` (an AlgorithmContext: its settings, the
models, and `await context.score(model, token_ids, start)` for logprobs under a model); it
returns its results, or an awaitable of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rlrun.common.wire import WireError
from rlrun.common.wire.env import BranchResult
from rlrun.common.wire.trace import Channel, Trace, validate_dims

Scorer = Callable[[list[str], list[int], int, float], Awaitable[list[float]]]
"""(replica addresses, token ids, start, temperature) -> logprobs of token_ids[start:]."""


@dataclass
class AlgorithmContext:
    """What one env-owned algorithm gets besides the traces."""

    args: dict[str, Any] = field(default_factory=dict)
    """Its settings: the run's `orchestrator.algorithm_args.<id>` ({} when the run has none)."""
    models: dict[str, list[str]] = field(default_factory=dict)
    """Model key (`policy`, `reference`, ...) -> the InferenceService replicas serving it."""
    scorer: Scorer | None = None

    async def score(
        self, model: str, token_ids: list[int], start: int, temperature: float = 1.0
    ) -> list[float]:
        """Logprobs of `token_ids[start:]` under `model` (InferenceService.Score)."""
        addresses = self.models.get(model)
        if not addresses:
            raise RuntimeError(
                f"the run sent no replicas of model {model!r} (it has: {sorted(self.models) or 'none'}); "
                f"configure [orchestrator.models.{model}]"
            )
        if self.scorer is None:
            raise RuntimeError("this env-server cannot score (no scorer)")
        return await self.scorer(addresses, token_ids, start, temperature)


EnvAlgorithm = Callable[..., "list[BranchResult] | Awaitable[list[BranchResult]]"]
"""Reads one group's traces (and optionally an AlgorithmContext), returns results for the
branches it assigns credit to."""


def _takes_context(algorithm: EnvAlgorithm) -> bool:
    try:
        parameters = inspect.signature(algorithm).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


async def call_algorithm(
    algorithm: EnvAlgorithm, traces: list[Trace], context: AlgorithmContext
) -> list[BranchResult]:
    results = algorithm(traces, context) if _takes_context(algorithm) else algorithm(traces)
    return list(await results if inspect.isawaitable(results) else results)


def sampled_advantage(trace: Trace, branch_index: int, advantage: float) -> BranchResult:
    """An RL channel holding `advantage` on every sampled token of the branch, which alone trains."""
    sampled = trace.branch_tokens(branch_index).sampled_mask
    return BranchResult(
        trace.id, branch_index, [Channel("rl", [advantage if s else 0.0 for s in sampled])], sampled
    )


async def run_env_algorithms(
    available: dict[str, EnvAlgorithm],
    ids: list[str],
    traces: list[Trace],
    contexts: dict[str, AlgorithmContext] | None = None,
) -> list[BranchResult]:
    """Runs `ids` in order, each with its context (`contexts[id]`; default: no settings, no
    models). Results for the same branch merge: channels are appended (the
    trainer sums channels of one loss) and masks are OR-ed (a token trains if any algorithm
    trains it). A result that names no branch or whose dimensions differ from the branch's
    length is the env's own bug and raises RuntimeError."""
    by_id = {trace.id: trace for trace in traces}
    merged: dict[tuple[str, int], BranchResult] = {}
    for algorithm_id in ids:
        context = (contexts or {}).get(algorithm_id) or AlgorithmContext()
        for result in await call_algorithm(available[algorithm_id], traces, context):
            trace = by_id.get(result.trace_id)
            if trace is None or not 0 <= result.branch_index < len(trace.branches):
                raise RuntimeError(
                    f"env algorithm {algorithm_id!r} returned a result for trace {result.trace_id!r} "
                    f"branch {result.branch_index}, which does not exist"
                )
            try:
                validate_dims(
                    f"{algorithm_id}[{result.trace_id}].branches[{result.branch_index}]",
                    trace.branch_length(result.branch_index),
                    result.mask,
                    result.channels,
                    length_name="the branch",
                )
            except WireError as error:
                raise RuntimeError(
                    f"env algorithm {algorithm_id!r} returned bad dimensions: {error}"
                ) from None
            key = (result.trace_id, result.branch_index)
            if key not in merged:
                merged[key] = BranchResult(
                    result.trace_id, result.branch_index, list(result.channels), list(result.mask)
                )
                continue
            into = merged[key]
            into.channels += result.channels
            into.mask = (
                [a or b for a, b in zip(into.mask, result.mask, strict=True)]
                if into.mask
                else list(result.mask)
            )
    return list(merged.values())
