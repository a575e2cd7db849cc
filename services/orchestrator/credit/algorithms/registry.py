"""The registry of builtin algorithms, by id. Ids that are not builtin resolve, per env, to the
env's own algorithms (run inside the env-server through RunAlgorithms)."""

from __future__ import annotations

from rlrun.orchestrator.credit.algorithms.base import Algorithm

_BUILTIN: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    if cls.name in _BUILTIN:
        raise ValueError(f"algorithm id {cls.name!r} is registered twice")
    _BUILTIN[cls.name] = cls
    return cls


def builtin(name: str) -> type[Algorithm] | None:
    return _BUILTIN.get(name)


def builtin_names() -> list[str]:
    return sorted(_BUILTIN)


def member_capable_names() -> list[str]:
    """Builtin ids defined for multi-agent groups (per-member traces)."""
    return sorted(name for name, cls in _BUILTIN.items() if cls.handles_members)
