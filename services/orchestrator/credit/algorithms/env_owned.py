"""Algorithms an env owns: ids that are not builtin run inside the env-server through
RunAlgorithms. The orchestrator validates every returned result against the branch it names
(trace, branch index, one mask entry and one value per channel per token, finite values)
before it writes it onto the trace: a malformed result is the env's bug and fails loudly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rlrun.common.types import Channel, Trace, WireError, validate_dims
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import Algorithm, AlgorithmDeps, add_credit


@dataclass
class BranchResult:
    trace_id: str
    branch_index: int
    channels: list[Channel]
    mask: list[bool]


RunAlgorithms = Callable[[str, list[str], list[Trace]], Awaitable[list[BranchResult]]]
"""(env id, algorithm ids, traces) -> results; the env-server's RunAlgorithms."""


def apply_branch_results(traces: list[Trace], results: list[BranchResult], where: str = "results") -> None:
    by_id = {trace.id: trace for trace in traces}
    for i, result in enumerate(results):
        at = f"{where}[{i}]"
        trace = by_id.get(result.trace_id)
        if trace is None:
            raise WireError(
                f"{at}.trace_id", f"{at}.trace_id {result.trace_id!r} names no trace of the group"
            )
        if not 0 <= result.branch_index < len(trace.branches):
            raise WireError(
                f"{at}.branch_index",
                f"{at}.branch_index {result.branch_index} is out of range: trace {trace.id!r} has {len(trace.branches)} branches",
            )
        if not result.mask:
            raise WireError(f"{at}.mask", f"{at}.mask is empty; it needs one entry per branch token")
        length = trace.branch_length(result.branch_index)
        validate_dims(at, length, result.mask, result.channels, length_name="the branch")
    for result in results:
        branch = by_id[result.trace_id].branches[result.branch_index]
        for channel in result.channels:
            add_credit(branch, channel.loss, channel.values, result.mask)


class EnvOwnedAlgorithms(Algorithm):
    """A consecutive run of env-owned ids in an env's algorithm list, run in one call."""

    name = "env-owned"
    handles_members = True  # the env defines them for its own (possibly multi-agent) traces

    def __init__(self, env_id: str, ids: list[str], run: RunAlgorithms):
        super().__init__({}, AlgorithmDeps())
        self.env_id = env_id
        self.ids = list(ids)
        self.run = run

    async def apply(self, group: RolloutGroup) -> None:
        results = await self.run(self.env_id, self.ids, group.traces)
        apply_branch_results(group.traces, results, where=f"RunAlgorithms({self.env_id}, {self.ids}).results")
