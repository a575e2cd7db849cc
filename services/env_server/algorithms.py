"""Env-owned algorithms: per-branch advantages and masks an environment computes itself.

The orchestrator sends a group's traces back through RunAlgorithms; the env-server runs the
named algorithms and returns one BranchResult per branch they touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlrun.common.types import Channel, Trace, WireError, validate_dims


@dataclass
class BranchResult:
    trace_id: str
    branch_index: int
    channels: list[Channel]
    """One value per branch token in each channel."""
    mask: list[bool]
    """Per branch token, true where the token trains."""


EnvAlgorithm = Callable[[list[Trace]], list[BranchResult]]
"""Reads one group's traces, returns results for the branches it assigns credit to."""


def sampled_advantage(trace: Trace, branch_index: int, advantage: float) -> BranchResult:
    """An RL channel holding `advantage` on every sampled token of the branch, which alone trains."""
    sampled = trace.branch_tokens(branch_index).sampled_mask
    return BranchResult(
        trace.id, branch_index, [Channel("rl", [advantage if s else 0.0 for s in sampled])], sampled
    )


def run_env_algorithms(
    available: dict[str, EnvAlgorithm], ids: list[str], traces: list[Trace]
) -> list[BranchResult]:
    """Runs `ids` in order. Results for the same branch merge: channels are appended (the
    trainer sums channels of one loss) and masks are OR-ed (a token trains if any algorithm
    trains it). A result that names no branch or whose dimensions differ from the branch's
    length is the env's own bug and raises RuntimeError."""
    by_id = {trace.id: trace for trace in traces}
    merged: dict[tuple[str, int], BranchResult] = {}
    for algorithm_id in ids:
        for result in available[algorithm_id](traces):
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
