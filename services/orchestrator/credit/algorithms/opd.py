"""opd: on-policy distillation. A reference model (orchestrator.models.<reference>) scores the
policy's own rollouts through InferenceService.Score; advantages are the per-token logprob
deltas (see logprob_delta). Calls are bounded by the target's max_concurrency (default 32)."""

from __future__ import annotations

from typing import Any

from rlrun.common.config import ConfigError
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms.base import Algorithm, AlgorithmArgs, AlgorithmDeps
from rlrun.orchestrator.credit.algorithms.logprob_delta import credit_logprob_deltas
from rlrun.orchestrator.credit.algorithms.registry import register


class OpdArgs(AlgorithmArgs):
    reference: str = "reference"
    """Key of [orchestrator.models] that scores the rollouts. Default: reference."""
    coef: float = 1.0
    """Scale of the logprob deltas. Default: 1."""


@register
class Opd(Algorithm):
    name = "opd"
    Args = OpdArgs
    handles_members = True  # per-token signal, no group statistics

    def __init__(self, args: dict[str, Any], deps: AlgorithmDeps):
        super().__init__(args, deps)
        if deps.scorer is None or deps.model_concurrency is None:
            raise ConfigError("orchestrator.algorithms", "opd needs a reference model to score with")
        self.scorer = deps.scorer(self.args.reference, deps.model_concurrency(self.args.reference))

    async def apply(self, group: RolloutGroup) -> None:
        await credit_logprob_deltas(group, self.scorer, self.args.coef, prefix=lambda trace: [])
