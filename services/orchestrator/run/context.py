"""What is fixed for a run once its services answered: the plans, the credit pipelines, the
task sampler, the filters and every phase's targets. Built once (`RunContext.build`) from the
config and the envs' descriptions."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.config.orchestrator import POLICY
from rlrun.common.wire.env import EnvInfo
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint
from rlrun.common.wire.trace import Trace
from rlrun.orchestrator.collect.rollouts import EnvRollouts, FailureSink
from rlrun.orchestrator.collect.sampler import EnvTasks, TaskSampler
from rlrun.orchestrator.credit.algorithms import AlgorithmDeps, BranchResult
from rlrun.orchestrator.credit.filters import RolloutFilters
from rlrun.orchestrator.credit.pipeline import CreditPipelines, EnvAlgorithmSpec
from rlrun.orchestrator.run.connections import Connections
from rlrun.orchestrator.run.plan import RunPlans, compile_plans, member_temperatures, trained_members
from rlrun.orchestrator.run.replicas import LiveReplicas
from rlrun.orchestrator.run.state import OrchestratorState
from rlrun.orchestrator.run.step import RunFailed

if TYPE_CHECKING:
    from rlrun.common.tokenizer import Tokenizer


def model_vocab_size(config: RunConfig) -> int:
    path = config.model.path / "config.json" if config.model.path is not None else config.model.config
    if path is None:
        raise ConfigError("model.config", "set model.path or model.config")
    return int(json.loads(Path(path).read_text())["vocab_size"])


def check_members(config: RunConfig, descriptions: dict[str, EnvInfo]) -> None:
    """The configured members against every env's (a multi-agent env names its seats)."""
    configured = sorted(m.id for m in config.orchestrator.members)
    for key, description in descriptions.items():
        offered = sorted(description.members)
        if offered and not configured:
            raise ConfigError(
                "orchestrator.members",
                f"env {key!r} is multi-agent (members: {', '.join(offered)}) "
                "but orchestrator.members is empty",
            )
        if configured and not offered:
            raise ConfigError(
                "orchestrator.members", f"env {key!r} is single-agent but orchestrator.members is set"
            )
        if configured != offered:
            raise ConfigError(
                "orchestrator.members",
                f"members {configured} differ from env {key!r}'s members {offered}",
            )


def algorithm_models(config: RunConfig, policy_addresses: list[str]) -> list[ModelEndpoint]:
    """The model endpoints RunAlgorithms carries: the live policy (at `policy_addresses`, the
    run's live list) and every inference target of [orchestrator.models] that has replicas
    (e.g. `reference`), so an env-owned algorithm can score with them."""
    endpoints = [ModelEndpoint(POLICY, "inference", policy_addresses)]
    for key, target in config.orchestrator.models.items():
        if target.kind == "inference" and target.addresses:
            endpoints.append(ModelEndpoint(key, "inference", list(target.addresses)))
    return endpoints


@dataclass(frozen=True)
class EvalSchedule:
    interval: int
    """Evaluate every this many RL steps (0: only before RL and at the end)."""
    num_tasks: int


def eval_schedule(config: RunConfig, eval_plans: dict[str, GenerationPlan]) -> dict[str, EvalSchedule]:
    ev = config.orchestrator.eval
    own = {env.key: env for env in ev.env}
    schedule = {}
    for key in eval_plans:
        entry = own.get(key)
        interval = entry.interval if entry is not None and entry.interval is not None else ev.interval
        num_tasks = entry.num_tasks if entry is not None and entry.num_tasks is not None else ev.num_tasks
        schedule[key] = EvalSchedule(interval, num_tasks)
    return schedule


class MessageRenderer:
    """Renders a chat message to token ids for algorithms that score text; the tokenizer is
    loaded on first use only."""

    def __init__(self, config: RunConfig):
        self._config = config
        self._tokenizer: Tokenizer | None = None

    def __call__(self, role: str, text: str) -> list[int]:
        if self._tokenizer is None:
            from rlrun.common.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self._config.model.tokenizer, self._config.model.path)
        return self._tokenizer.render_message(role, text)


@dataclass(frozen=True)
class RunContext:
    descriptions: dict[str, EnvInfo]
    plans: RunPlans
    credit: CreditPipelines
    """The RL phase's algorithms."""
    warm_credit: CreditPipelines | None
    """The warm start's algorithm (None: no warm start)."""
    sampler: TaskSampler
    filters: RolloutFilters
    train_targets: dict[str, EnvRollouts]
    warmup_targets: dict[str, EnvRollouts]
    eval_targets: dict[str, EnvRollouts]
    """The envs evaluated: [[orchestrator.eval.env]] when given, else the training envs."""
    dev_targets: dict[str, EnvRollouts]
    initial: OrchestratorState
    """What a run at step 0 (a fresh trainer's checkpoint) starts from."""
    eval_schedule: dict[str, EvalSchedule] = field(default_factory=dict)
    """Eval env key -> its interval and task count."""

    @property
    def has_warmup(self) -> bool:
        return bool(self.plans.warmup)

    def task_counts(self, split: str, envs: Iterable[str] | None = None) -> dict[str, int]:
        """Tasks of `split` per env (of `envs` only, when given)."""
        keys = list(self.descriptions) if envs is None else list(envs)
        return {key: self.descriptions[key].task_counts[split] for key in keys}

    @classmethod
    def build(
        cls,
        config: RunConfig,
        connections: Connections,
        descriptions: dict[str, EnvInfo],
        failures: FailureSink | None = None,
        replicas: LiveReplicas | None = None,
    ) -> RunContext:
        """`failures` hears of every failing rollout of every phase (the run's status);
        `replicas`: the live policy's addresses as the run follows them (default: the config's)."""
        orch = config.orchestrator
        check_members(config, descriptions)
        live = replicas.addresses if replicas is not None else list(config.inference.addresses)
        plans = compile_plans(config, connections.tokenizer, live)
        env_by_id = {descriptions[e.key].env_id: connections.envs[e.key] for e in orch.train.env}

        models = algorithm_models(config, live)

        async def run_algorithms(env_id: str, ids: list[str], traces: list[Trace]) -> list[BranchResult]:
            return await env_by_id[env_id].run_algorithms(env_id, ids, traces, orch.algorithm_args, models)

        deps = AlgorithmDeps(
            scorer=connections.scorer,
            render_message=MessageRenderer(config),
            model_concurrency=connections.model_concurrency,
        )
        members = [m.id for m in orch.members]
        specs = [
            EnvAlgorithmSpec(
                env.key,
                descriptions[env.key].env_id,
                list(env.algorithms or orch.algorithms),
                descriptions[env.key].algorithms,
                descriptions[env.key].members or members,
                f"orchestrator.train.env.{i}.algorithms" if env.algorithms else "orchestrator.algorithms",
            )
            for i, env in enumerate(orch.train.env)
        ]
        credit = CreditPipelines(specs, orch.algorithm_args, deps, run_algorithms)
        warm_credit = None
        if plans.warmup:
            warm_specs = [
                EnvAlgorithmSpec(
                    s.env,
                    s.env_id,
                    [orch.warm_start.algorithm],
                    s.owned,
                    s.members,
                    "orchestrator.warm_start.algorithm",
                )
                for s in specs
            ]
            warm_credit = CreditPipelines(warm_specs, orch.algorithm_args, deps, run_algorithms)

        def task_count(env: str, split: str) -> int:
            counts = descriptions[env].task_counts
            if counts.get(split, 0) <= 0:
                raise RunFailed(f"env {env!r} reports no {split!r} tasks (task counts: {counts})")
            return counts[split]

        held_out = orch.warm_start.dev_tasks if plans.warmup else 0
        sampler = TaskSampler(
            [EnvTasks(env.key, env.ratio, task_count(env.key, "train"), held_out) for env in orch.train.env],
            orch.seed,
        )
        if orch.eval.enabled:
            for key in plans.eval:
                task_count(key, "eval")
        filters = RolloutFilters(orch.filters, model_vocab_size(config))

        def targets(phase_plans: dict[str, GenerationPlan]) -> dict[str, EnvRollouts]:
            return {
                key: EnvRollouts(
                    env=key,
                    client=connections.envs[key],
                    plan=plan,
                    trained_members=trained_members(plan, orch.multi_agent.drop_judge),
                    temperatures=member_temperatures(plan),
                    learner_seat_only=orch.multi_agent.filter_by_learner_seat,
                    failures=failures,
                )
                for key, plan in phase_plans.items()
            }

        eval_targets, dev_targets = targets(plans.eval), targets(plans.dev)
        return cls(
            descriptions=descriptions,
            plans=plans,
            credit=credit,
            warm_credit=warm_credit,
            sampler=sampler,
            filters=filters,
            train_targets=targets(plans.train),
            warmup_targets=targets(plans.warmup),
            eval_targets=eval_targets,
            dev_targets=dev_targets,
            initial=OrchestratorState(
                trainer_step=0, policy_version=0, sampler=sampler.state(), algorithms=credit.state_dict()
            ),
            eval_schedule=eval_schedule(config, plans.eval),
        )
