"""Compiles the run configuration into GenerationPlans, once, at the config boundary: the one
compiler of every plan a run (and `rlrun eval`) sends.

A single-agent run becomes a one-target plan keyed "policy"; a multi-agent run
([[orchestrator.members]]) becomes the same type keyed by member id, each member with the role
`train` (the live policy) or `fixed` (a named model target). A plan is complete as compiled:
the live policy's tokenizer, the replicas serving its text-level RPCs, and every target's stop
tokens with the chat format's end-of-message tokens merged in (here, and nowhere else). The
scheduler, the eval and the env-server requests read only these plans, never the raw config.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlrun.common.config import POLICY, ConfigError, EnvConfig, RunConfig, SamplingConfig, SamplingOverrides
from rlrun.common.wire import WireError
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget, TokenizerInfo
from rlrun.common.wire.sampling import SamplingParams

log = logging.getLogger(__name__)

ORACLE = "oracle"
"""Model key of the env's rule-based reference solver (the warm start's default actor)."""


def sampling_params(
    base: SamplingConfig, *overrides: SamplingOverrides, greedy: bool = False
) -> SamplingParams:
    """The base sampling with each override applied in order; greedy forces temperature 0."""
    for override in overrides:
        base = override.apply(base)
    return SamplingParams(
        max_tokens=base.max_completion_tokens,
        temperature=0.0 if greedy else base.temperature,
        top_p=base.top_p,
        top_k=base.top_k,
    )


def model_endpoint(key: str, config: RunConfig, policy_addresses: list[str] | None = None) -> ModelEndpoint:
    """The endpoint of a model key: the live policy, a key of [orchestrator.models] (an
    InferenceService, the env's rules, or an external OpenAI-compatible API), or the env's
    rule-based oracle. `policy_addresses`: the list the live policy's endpoint holds (the
    run's `LiveReplicas.addresses`, which follows the run file), else a copy of the config's."""
    if key == POLICY:
        if not config.inference.addresses:
            raise ConfigError("inference.addresses", "no replica of the live policy is configured")
        return ModelEndpoint(
            POLICY,
            "inference",
            list(config.inference.addresses) if policy_addresses is None else policy_addresses,
            http_addresses=list(config.inference.http_addresses),
        )
    target = config.orchestrator.models.get(key)
    if target is None:
        if key == ORACLE:
            return ModelEndpoint(ORACLE, "rule", [])
        raise ConfigError(
            "orchestrator.models", f"model key {key!r} is not `policy` or a key of orchestrator.models"
        )
    if target.kind == "inference" and not target.addresses:
        raise ConfigError(
            f"orchestrator.models.{key}.addresses", "no replica of this inference target is configured"
        )
    if target.kind == "openai":
        return ModelEndpoint(
            key,
            "openai",
            base_url=target.base_url,
            model=target.model,
            api_key_env=target.api_key_env,
            max_concurrency=target.max_concurrency,
            max_retries=target.max_retries,
            timeout_s=target.timeout_s,
        )
    return ModelEndpoint(key, target.kind, list(target.addresses))


def compile_plan(
    config: RunConfig,
    *,
    actor: str,
    sampling: SamplingParams,
    tokenizer: TokenizerInfo | None = None,
    text_addresses: Sequence[str] = (),
    policy_addresses: list[str] | None = None,
) -> GenerationPlan:
    """One plan: single-agent -> {"policy": actor}; multi-agent -> one target per member, where
    `actor` plays every `train` member and fixed members keep their own model. `tokenizer`:
    the live policy's, as its replicas report it (its end-of-message tokens join every
    target's stop tokens, so an env that forwards the sampling as is stops where a message
    ends); `text_addresses`: the replicas serving its text-level RPCs; `policy_addresses`: see
    model_endpoint."""
    tokenizer = tokenizer or TokenizerInfo()
    sampling = sampling.with_stop_tokens(tokenizer.stop_token_ids)
    members = config.orchestrator.members
    if not members:
        role = "train" if actor == POLICY else "fixed"
        targets = {
            POLICY: PlanTarget(POLICY, role, model_endpoint(actor, config, policy_addresses), sampling)
        }
    else:
        targets = {
            m.id: PlanTarget(
                m.id,
                m.role,
                model_endpoint(actor if m.role == "train" else m.model, config, policy_addresses),
                sampling,
            )
            for m in members
        }
    # A list is kept as is: the run's live replica list, which the plan then follows.
    texts = text_addresses if isinstance(text_addresses, list) else list(text_addresses)
    plan = GenerationPlan(targets, tokenizer, texts)
    try:
        plan.validate()
    except WireError as error:
        raise ConfigError("orchestrator", f"the compiled generation plan is invalid: {error}") from None
    return plan


JUDGE = "judge"
"""Member id of a multi-agent env's judge (orchestrator.multi_agent.drop_judge)."""


def trained_members(plan: GenerationPlan, drop_judge: bool = False) -> frozenset[str]:
    """Members whose traces train: the single target of a single-agent plan (whoever plays it,
    the policy learns from it), or the `train` members of a multi-agent plan, less the judge
    with `drop_judge`."""
    if not plan.is_multi_agent:
        return frozenset(plan.targets)
    return frozenset(
        key
        for key, target in plan.targets.items()
        if target.role == "train" and not (drop_judge and key == JUDGE)
    )


def samples_live_policy(plan: GenerationPlan) -> bool:
    """Whether trained rollouts come from the live policy, so that staleness applies."""
    return any(plan.targets[m].model.name == POLICY for m in trained_members(plan))


def member_temperatures(plan: GenerationPlan) -> dict[str, float]:
    """Per member, the temperature fanned out over its samples, which the trainer recomputes
    logprobs at: the target's configured sampling temperature, whatever the env declares
    (see check_env_temperature); 1 for greedy targets and for rule-played targets (their
    tokens were not sampled from logits)."""
    out = {}
    for key, target in plan.targets.items():
        temperature = target.sampling.temperature
        out[key] = temperature if target.model.kind == "inference" and temperature > 0 else 1.0
    return out


def check_env_temperature(config: RunConfig, index: int, declared: float) -> None:
    """An env's declared temperature (EnvInfo.temperature; 0: none) against the configured one.
    A different one raises ConfigError when the env's trained tokens are sampled from a model
    (the trainer recomputes their logprobs at the configured temperature, so every importance
    ratio would be off) and is logged as a warning otherwise."""
    env = config.orchestrator.train.env[index]
    configured = _env_sampling(config, env).temperature
    if declared == 0 or math.isclose(declared, configured, rel_tol=1e-6):
        return
    plan = compile_plan(config, actor=config.orchestrator.actor, sampling=_env_sampling(config, env))
    sampled = [
        m
        for m in trained_members(plan)
        if plan.targets[m].model.kind == "inference" and plan.targets[m].sampling.temperature > 0
    ]
    what = (
        f"env {env.key!r} declares temperature {declared:g} (EnvInfo.temperature) but the run samples "
        f"at {configured:g}, the temperature the trainer recomputes logprobs at"
    )
    if sampled:
        raise ConfigError(
            f"orchestrator.train.env.{index}",
            f"{what}: the importance ratio of member(s) {', '.join(sorted(sampled))} would be wrong. "
            "Set the run's temperature (orchestrator.train.sampling.temperature or this entry's "
            "sampling.temperature) to the env's, or make the env declare 0 and sample at "
            "PlanTarget.sampling.temperature",
        )
    log.warning("%s; no trained member samples from a model, so training is unaffected", what)


@dataclass
class RunPlans:
    """Every plan of the run, per env key."""

    train: dict[str, GenerationPlan]
    eval: dict[str, GenerationPlan]
    """The envs evaluated, with the eval's sampling (greedy by default) for the live policy:
    each [[orchestrator.eval.env]] entry (the training sampling, then orchestrator.eval's, then
    its own), or when there is none, the training envs (theirs, then orchestrator.eval's)."""
    warmup: dict[str, GenerationPlan]
    """The warm start's actor (empty when there is no warm start)."""
    dev: dict[str, GenerationPlan]
    """The live policy, always greedy: the warm start's dev-set check (empty without a warm start)."""


def eval_entries(config: RunConfig) -> dict[str, tuple[EnvConfig, SamplingParams]]:
    """What an eval runs, by env key, with its sampling: the `[[orchestrator.eval.env]]`
    entries (the training sampling, orchestrator.eval's, then the entry's) when there are any,
    the training envs' eval split otherwise (the training sampling, the env's, then
    orchestrator.eval's). Both a run's evals and `rlrun eval` read it."""
    orch = config.orchestrator
    greedy = orch.eval.greedy
    if orch.eval.env:
        return {
            env.key: (
                env,
                sampling_params(orch.train.sampling, orch.eval.sampling, env.sampling, greedy=greedy),
            )
            for env in orch.eval.env
        }
    return {
        env.key: (env, sampling_params(orch.train.sampling, env.sampling, orch.eval.sampling, greedy=greedy))
        for env in orch.train.env
    }


def compile_plans(
    config: RunConfig, tokenizer: TokenizerInfo | None = None, policy_addresses: list[str] | None = None
) -> RunPlans:
    """Every plan of the run (see compile_plan for `tokenizer` and `policy_addresses`; the
    live policy's replicas serve the text-level RPCs)."""
    orch = config.orchestrator

    def plan(actor: str, sampling: SamplingParams) -> GenerationPlan:
        return compile_plan(
            config,
            actor=actor,
            sampling=sampling,
            tokenizer=tokenizer,
            text_addresses=[] if policy_addresses is None else policy_addresses,
            policy_addresses=policy_addresses,
        )

    train: dict[str, GenerationPlan] = {}
    evals: dict[str, GenerationPlan] = {}
    warmup: dict[str, GenerationPlan] = {}
    dev: dict[str, GenerationPlan] = {}
    for env in orch.train.env:
        train[env.key] = plan(orch.actor, _env_sampling(config, env))
        if orch.warm_start.max_steps > 0:
            warmup[env.key] = plan(orch.warm_start.actor, _env_sampling(config, env))
            dev[env.key] = plan(POLICY, sampling_params(orch.train.sampling, env.sampling, greedy=True))
    for key, (_, sampling) in eval_entries(config).items():
        evals[key] = plan(POLICY, sampling)
    return RunPlans(train=train, eval=evals, warmup=warmup, dev=dev)


def _env_sampling(config: RunConfig, env: EnvConfig) -> SamplingParams:
    return sampling_params(config.orchestrator.train.sampling, env.sampling)
