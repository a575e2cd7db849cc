"""The algorithm registry (`rlrun.common.registry`; installed algorithms: entry point group
`rlrun.algorithms`), by id. Ids it does not hold resolve, per env, to the env's own algorithms
(run inside the env-server through RunAlgorithms)."""

from __future__ import annotations

from rlrun.common.registry import Registry
from rlrun.orchestrator.credit.algorithms.base import Algorithm

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "rlrun.algorithms", Algorithm)

register = ALGORITHMS.register


def builtin(name: str) -> type[Algorithm] | None:
    return ALGORITHMS.get(name)


def builtin_names() -> list[str]:
    return ALGORITHMS.names()


def member_capable_names() -> list[str]:
    """Ids defined for multi-agent groups (per-member traces)."""
    return sorted(name for name, cls in ALGORITHMS.items() if cls.handles_members)
