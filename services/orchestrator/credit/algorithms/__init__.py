"""Algorithm registry: one module per builtin algorithm (grpo, max_rl, rl, sft, echo, opd,
opsd, ema_per_member), plus the adapter for env-owned algorithms. Importing this package
registers them all."""

from rlrun.orchestrator.credit.algorithms import echo, ema_per_member, grpo, max_rl, opd, opsd, rl, sft
from rlrun.orchestrator.credit.algorithms.base import Algorithm, AlgorithmDeps, Scorer
from rlrun.orchestrator.credit.algorithms.env_owned import (
    BranchResult,
    EnvOwnedAlgorithms,
    apply_branch_results,
)
from rlrun.orchestrator.credit.algorithms.registry import builtin, builtin_names

__all__ = [
    "Algorithm",
    "AlgorithmDeps",
    "BranchResult",
    "EnvOwnedAlgorithms",
    "Scorer",
    "apply_branch_results",
    "builtin",
    "builtin_names",
    "echo",
    "ema_per_member",
    "grpo",
    "max_rl",
    "opd",
    "opsd",
    "rl",
    "sft",
]
