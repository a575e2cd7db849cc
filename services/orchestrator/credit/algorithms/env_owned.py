"""Algorithms an env owns: ids that are not builtin run inside the env-server through
RunAlgorithms. The orchestrator validates every returned result against the branch it names
(trace, branch index, one mask entry and one value per channel per token, finite values)
before it writes it onto the trace: a malformed result is the env's bug and fails loudly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rlrun.common.wire.env import BranchResult, check_branch_results
from rlrun.common.wire.trace import Trace
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import Algorithm, AlgorithmDeps, add_credit

RunAlgorithms = Callable[[str, list[str], list[Trace]], Awaitable[list[BranchResult]]]
"""(env id, algorithm ids, traces) -> results; the env-server's RunAlgorithms."""


def apply_branch_results(traces: list[Trace], results: list[BranchResult], where: str = "results") -> None:
    check_branch_results(results, traces, where)
    by_id = {trace.id: trace for trace in traces}
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
