"""opsd: on-policy self-distillation. The reference is the live policy itself, shown a
demonstration hint (e.g. the task's reference answer) ahead of the conversation: tokens that
become more likely once the policy knows the answer get positive advantages.

The hint text comes from the trace's info, else from the task data (JSON), under `hint_key`;
a task without one is an error, not a silent zero.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from rlrun.common.config import POLICY, ConfigError
from rlrun.common.wire.trace import Trace
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import Algorithm, AlgorithmArgs, AlgorithmDeps
from rlrun.orchestrator.credit.algorithms.logprob_delta import credit_logprob_deltas
from rlrun.orchestrator.credit.algorithms.registry import register


class OpsdArgs(AlgorithmArgs):
    hint_key: str = "answer"
    """Key of the demonstration in the trace info or the task data. Default: answer."""
    hint_template: str = "Reference answer: {hint}"
    """Text of the hint message; `{hint}` is replaced by the demonstration. Default: "Reference answer: {hint}"."""
    hint_role: str = "system"
    """Chat role of the hint message, rendered ahead of the branch. Default: system."""
    coef: float = 1.0
    """Scale of the logprob deltas. Default: 1."""
    max_concurrency: int = Field(32, ge=1)
    """Most concurrent Score calls to the policy. Default: 32."""


def demonstration(trace: Trace, key: str) -> str:
    if key in trace.info:
        return trace.info[key]
    data = json.loads(trace.task.data) if trace.task.data else {}
    if isinstance(data, dict) and key in data:
        return str(data[key])
    raise ValueError(
        f"opsd: trace {trace.id!r} (env {trace.task.env!r}, task {trace.task.idx}) has no demonstration under "
        f"{key!r} in its info or task data; set orchestrator.algorithm_args.opsd.hint_key"
    )


@register
class Opsd(Algorithm):
    name = "opsd"
    Args = OpsdArgs
    handles_members = True  # per-token signal, no group statistics

    def __init__(self, args: dict[str, Any], deps: AlgorithmDeps):
        super().__init__(args, deps)
        if deps.scorer is None or deps.render_message is None:
            raise ConfigError("orchestrator.algorithms", "opsd needs the policy's tokenizer and a scorer")
        self.scorer = deps.scorer(POLICY, self.args.max_concurrency)
        self.render = deps.render_message

    def hint_tokens(self, trace: Trace) -> list[int]:
        text = self.args.hint_template.format(hint=demonstration(trace, self.args.hint_key))
        return self.render(self.args.hint_role, text)

    async def apply(self, group: RolloutGroup) -> None:
        await credit_logprob_deltas(group, self.scorer, self.args.coef, prefix=self.hint_tokens)
