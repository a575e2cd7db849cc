"""Resolves each env's algorithm ids into the ordered pipeline that credits its groups.

Builtin ids become one shared instance per id (so state such as running baselines is kept
once and checkpointed); consecutive env-owned ids become one RunAlgorithms call. An id that
is neither is a startup error naming it and the env, and so is a multi-agent env paired with
an algorithm that cannot handle members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlrun.common.config import ConfigError
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms import (
    Algorithm,
    AlgorithmDeps,
    EnvOwnedAlgorithms,
    builtin,
    builtin_names,
)
from rlrun.orchestrator.credit.algorithms.env_owned import RunAlgorithms
from rlrun.orchestrator.credit.algorithms.registry import member_capable_names


@dataclass(frozen=True)
class EnvAlgorithmSpec:
    env: str
    """Env key (EnvConfig.key)."""
    env_id: str
    """The id the env-server knows the env by (EnvInfo.env_id)."""
    ids: list[str]
    """Algorithm ids for this env's groups, in order."""
    owned: list[str]
    """Ids the env implements itself (EnvInfo.algorithms)."""
    members: list[str]
    """Member ids when the env is multi-agent, else empty."""
    where: str = "orchestrator.algorithms"
    """Config key the ids came from (for errors)."""


class CreditPipelines:
    def __init__(
        self,
        specs: list[EnvAlgorithmSpec],
        algorithm_args: dict[str, dict[str, Any]],
        deps: AlgorithmDeps,
        run_algorithms: RunAlgorithms,
    ):
        self.instances: dict[str, Algorithm] = {}
        self.pipelines: dict[str, list[Algorithm]] = {}
        for spec in specs:
            self.pipelines[spec.env] = self._resolve(spec, algorithm_args, deps, run_algorithms)

    def _resolve(
        self,
        spec: EnvAlgorithmSpec,
        args: dict[str, dict[str, Any]],
        deps: AlgorithmDeps,
        run_algorithms: RunAlgorithms,
    ) -> list[Algorithm]:
        pipeline: list[Algorithm] = []
        owned_run: list[str] = []
        for algorithm_id in spec.ids:
            cls = builtin(algorithm_id)
            if cls is None:
                if algorithm_id not in spec.owned:
                    raise ConfigError(
                        spec.where,
                        f"algorithm {algorithm_id!r} for env {spec.env!r} is neither builtin ({', '.join(builtin_names())}) "
                        f"nor owned by the env (it offers: {', '.join(spec.owned) or 'none'})",
                    )
                owned_run.append(algorithm_id)
                continue
            if owned_run:
                pipeline.append(EnvOwnedAlgorithms(spec.env_id, owned_run, run_algorithms))
                owned_run = []
            if cls.needs_members and not spec.members:
                raise ConfigError(
                    spec.where,
                    f"algorithm {algorithm_id!r} keeps one baseline per member, but env {spec.env!r} is "
                    "single-agent (it reports no members); use it with a multi-agent env and "
                    "orchestrator.members, or pick a single-agent algorithm such as grpo",
                )
            if spec.members and not cls.handles_members:
                raise ConfigError(
                    spec.where,
                    f"env {spec.env!r} is multi-agent (members: {', '.join(spec.members)}) but algorithm "
                    f"{algorithm_id!r} cannot handle members; pick one that does ({', '.join(member_capable_names())}) "
                    "or one the env owns",
                )
            if algorithm_id not in self.instances:
                self.instances[algorithm_id] = cls(args.get(algorithm_id, {}), deps)
            pipeline.append(self.instances[algorithm_id])
        if owned_run:
            pipeline.append(EnvOwnedAlgorithms(spec.env_id, owned_run, run_algorithms))
        return pipeline

    async def apply(self, group: RolloutGroup) -> None:
        for algorithm in self.pipelines[group.env]:
            await algorithm.apply(group)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {
            name: state for name, algorithm in self.instances.items() if (state := algorithm.state_dict())
        }

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        unknown = sorted(set(state) - set(self.instances))
        if unknown:
            raise ValueError(f"the checkpoint holds state of algorithms this run does not use: {unknown}")
        for name, algorithm in self.instances.items():
            algorithm.load_state_dict(state.get(name, {}))
