"""[orchestrator]: tasks, plan, algorithms, staleness, filters, eval and warm start."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlrun.common.config.base import Section
from rlrun.common.config.env import EnvConfig
from rlrun.common.config.sampling import SamplingConfig, SamplingOverrides

POLICY = "policy"
"""The model key of the live, trained policy."""


class TrainConfig(Section):
    sampling: SamplingConfig = SamplingConfig()
    """Sampling of training rollouts."""

    env: list[EnvConfig] = Field(min_length=1)
    """The environments; at least one."""


class EvalEnvConfig(EnvConfig):
    """[[orchestrator.eval.env]]: an environment that is only evaluated, never trained on; the
    keys of [[orchestrator.train.env]] (its env-server, args, harness, pool, address, sampling)
    plus its own interval and task count."""

    interval: int | None = Field(None, ge=0)
    """Evaluate this env every this many RL steps (0 = only at start and end). Default: unset
    (orchestrator.eval.interval)."""

    num_tasks: int | None = Field(None, ge=1)
    """Tasks of its eval split per eval (capped by the split's size). Default: unset
    (orchestrator.eval.num_tasks)."""

    @model_validator(mode="after")
    def _eval_only(self) -> EvalEnvConfig:
        for key in ("ratio", "algorithms"):
            if key in self.model_fields_set:
                raise ValueError(f"`{key}` is about training; an eval env ({self.key!r}) trains nothing")
        return self


class EvalConfig(Section):
    enabled: bool = True
    """Evaluate on the eval split at the start, every `interval` steps, and at the end. Default: true."""

    interval: int = Field(10, ge=0)
    """Evaluate every this many steps (0 = only at start and end). Default: 10."""

    num_tasks: int = Field(256, ge=1)
    """Held-out tasks per eval (capped by the eval split's size). Default: 256."""

    greedy: bool = True
    """Decode greedily (temperature 0). Default: true."""

    pass_k: int = Field(1, ge=1)
    """Samples per task; pass@k counts a task solved when any sample reaches `solved_threshold`.
    Needs greedy = false when above 1. Default: 1."""

    solved_threshold: float = 1.0
    """Reward at or above which a sample counts as solved for pass@k. Default: 1.0."""

    sampling: SamplingOverrides = SamplingOverrides()
    """Sampling overrides for eval (temperature is forced to 0 when greedy). Default: none."""

    env: list[EvalEnvConfig] = []
    """Envs evaluated instead of the training envs' eval split, each with its own sampling
    (over `sampling`), interval and task count. Default: none (eval runs the training envs'
    eval split)."""

    @model_validator(mode="after")
    def _greedy_single(self) -> EvalConfig:
        if self.greedy and self.pass_k > 1:
            raise ValueError("orchestrator.eval.pass_k > 1 needs orchestrator.eval.greedy = false")
        return self


class ModelTargetConfig(Section):
    kind: Literal["inference", "rule", "openai"] = "inference"
    """`inference`: an InferenceService; `rule`: the env's rule-based implementation plays this
    target (no model); `openai`: an external OpenAI-compatible chat API (`base_url`, `model`,
    `api_key_env`), e.g. an opponent or an LLM judge. Default: inference."""

    addresses: list[str] = []
    """gRPC host:port of the replicas. Empty for an inference target means `rlrun local` or the
    operator starts one from `checkpoint` (or from [model] when unset). Default: empty."""

    checkpoint: str | None = None
    """Local HF checkpoint directory the started server loads. Default: unset (same as [model])."""

    max_concurrency: int = Field(32, ge=1)
    """Most concurrent calls to this target (e.g. reference scoring; for `openai`, per
    env-server worker process). Default: 32."""

    base_url: str = ""
    """kind `openai`: the API's base URL, up to `/chat/completions` (e.g.
    `https://api.openai.com/v1`). Required for `openai`. Default: empty."""

    model: str = ""
    """kind `openai`: the model name sent with every request. Required for `openai`. Default: empty."""

    api_key_env: str = ""
    """kind `openai`: name of the environment variable that holds the API key, read by the
    env-server when it calls (the key is never written to the config, a plan or a log). Empty:
    no key is sent. Default: empty."""

    max_retries: int = Field(3, ge=0)
    """kind `openai`: retries of a call answered 429 or 5xx, or that could not connect
    (exponential backoff, Retry-After honoured). Default: 3."""

    timeout_s: float = Field(60.0, gt=0)
    """kind `openai`: deadline of one call in seconds. Default: 60."""

    @model_validator(mode="after")
    def _openai_fields(self) -> ModelTargetConfig:
        if self.kind == "openai":
            missing = [name for name in ("base_url", "model") if not getattr(self, name)]
            if missing:
                raise ValueError(f"a target of kind `openai` needs {' and '.join(missing)}")
            if self.addresses or self.checkpoint:
                raise ValueError("a target of kind `openai` takes base_url, not addresses or checkpoint")
        elif self.base_url or self.model or self.api_key_env:
            raise ValueError("base_url, model and api_key_env are for a target of kind `openai`")
        return self


class MemberConfig(Section):
    id: str
    """Member id, as the env names it (e.g. `debater_a`, `judge`). Required."""

    role: Literal["train", "fixed"]
    """`train`: the learner, on the live policy. `fixed`: a named, frozen model target. Required."""

    model: str = POLICY
    """Model key: `policy` or a key of [orchestrator.models]. Default: policy."""


class MultiAgentConfig(Section):
    drop_judge: bool = True
    """Exclude traces of members named `judge` from training. Default: true."""

    filter_by_learner_seat: bool = False
    """Train only the member the env marked as the learner (trace info `learner_seat`); a rollout
    without it is an error. Default: false."""


class GibberishFilterConfig(Section):
    enabled: bool = False
    """Flag rollouts with a rare token sampled at very low probability. Default: false."""

    enforce: bool = True
    """true: flagged rollouts never train; false: only counted in metrics. Default: true."""

    token_id_above: int = Field(0, ge=0)
    """Only token ids above this count (rare tokens in a frequency-ordered vocab). Default: 0."""

    logprob_offset: float = 2.0
    """Flag when logprob < −log(vocab_size) − offset. Default: 2.0."""


class RepetitionFilterConfig(Section):
    enabled: bool = False
    """Flag rollouts with a run of near-certain tokens (degenerate loops). Default: false."""

    enforce: bool = True
    """true: flagged rollouts never train; false: only counted in metrics. Default: true."""

    window: int = Field(32, ge=2)
    """Length of the run of consecutive near-certain tokens that flags. Default: 32."""

    logprob_above: float = Field(-0.01, le=0)
    """A token is near-certain when its logprob is above this. Default: −0.01."""


class FiltersConfig(Section):
    gibberish: GibberishFilterConfig = GibberishFilterConfig()
    """The gibberish filter."""

    repetition: RepetitionFilterConfig = RepetitionFilterConfig()
    """The repetition filter."""


class GroupFailuresConfig(Section):
    """When failed groups stop the run. A group that still fails after `max_retries` (an
    env-server answering INTERNAL or INVALID_ARGUMENT, trace errors, an invalid trace) is
    dropped and counted, and the run goes on: one bad task or one odd model output must not end
    it. Only a sustained failure rate of one env does, naming the env and its last error."""

    window: int = Field(64, ge=1)
    """How many of an env's most recently finished groups the failure rate is measured over.
    Default: 64."""

    max_ratio: float = Field(0.5, gt=0, le=1)
    """The run stops once `ceil(max_ratio × window)` of an env's last `window` finished groups
    failed (the window need not be full: with the defaults, an env whose first 32 groups all
    fail stops the run). 1.0 stops only on `window` failures in a row. Default: 0.5."""


class TracesConfig(Section):
    """The trace files of `rlrun dashboard`'s trace viewer: `<run_dir>/traces/<phase>_step_<N>.jsonl`,
    a few of each step's groups with every token's text, mask, loss channel, advantage and
    logprob, and the groups dropped on the way (docs/dashboard.md). A file holds about
    `groups_per_step` × `group_size` traces, some 30 bytes per token."""

    groups_per_step: int = Field(2, ge=0)
    """Trained groups of a step written, spread evenly over its batch (0 = none). Default: 2."""

    dropped_per_step: int = Field(2, ge=0)
    """Groups dropped since the previous step (stale or failed) written with their reason.
    Default: 2."""

    interval: int = Field(1, ge=1)
    """Write the traces of every this-many-th step of each phase (warm start and RL). Default: 1."""


class WarmStartConfig(Section):
    max_steps: int = Field(0, ge=0)
    """Most supervised steps before RL (0 = no warm start). Default: 0."""

    target_reward: float | None = None
    """Stop the warm start once the dev-set greedy reward reaches this. Default: unset (run
    max_steps)."""

    algorithm: str = "sft"
    """Algorithm of the warm start. Default: sft."""

    actor: str = "oracle"
    """Model key that produces the demonstrations; the default `oracle` is the env's rule-based
    reference solver. Default: oracle."""

    batch_size: int = Field(64, ge=1)
    """Tasks per warm-start step. Default: 64."""

    lr: float | None = Field(None, gt=0)
    """Learning rate of the warm start; unset means the trainer's schedule. Default: unset."""

    eval_interval: int = Field(2, ge=1)
    """Check the dev set every this many warm-start steps. Default: 2."""

    dev_tasks: int = Field(64, ge=1)
    """Train-split tasks held out as the dev set (never trained on). Default: 64."""


class OrchestratorConfig(Section):
    address: str = ""
    """gRPC host:port of the orchestrator's status API. Filled in by `rlrun local` and the
    operator. Default: empty."""

    seed: int = 0
    """Seed of the task sampler. Default: 0."""

    max_steps: int = Field(100, ge=1)
    """RL steps (trainer batches) of the run. Default: 100."""

    batch_size: int = Field(16, ge=1)
    """Groups (tasks) per step. Default: 16."""

    group_size: int = Field(8, ge=1)
    """Rollouts per task. Default: 8."""

    max_off_policy_steps: int = Field(1, ge=0)
    """A group generated more than this many policy versions before training is dropped whole.
    0 is synchronous. Default: 1."""

    max_inflight_groups: int | None = Field(None, ge=1)
    """Bound on groups in flight; unset means batch_size × (max_off_policy_steps + 1). Default: unset."""

    max_retries: int = Field(3, ge=0)
    """Retries of a failed group before it is dropped: an env-server answering UNAVAILABLE,
    DEADLINE_EXCEEDED, INTERNAL or INVALID_ARGUMENT, or traces with errors the env marks
    retryable. Default: 3."""

    group_failures: GroupFailuresConfig = GroupFailuresConfig()
    """The failure rate at which dropped groups stop the run."""

    rollout_timeout_s: float = Field(300.0, gt=0)
    """Deadline of one group's rollouts. Default: 300."""

    startup_timeout_s: float = Field(300.0, gt=0)
    """How long to wait at start for every env-server, the trainer and the inference replicas to
    report SERVING. Default: 300."""

    replica_refresh_s: float = Field(2.0, gt=0)
    """How often a running orchestrator re-reads `inference.addresses` from its run file
    (the operator rewrites it when inference scales): groups sent after a change spread over
    the new replicas, and none is lost to it (rlrun.orchestrator.run.replicas). Default: 2."""

    save_rollouts_interval: int = Field(0, ge=0)
    """Write every trace of every this-many-th step to `<run_dir>/rollouts/step_<N>.jsonl`
    (0 = never). Default: 0."""

    traces: TracesConfig = TracesConfig()
    """The dashboard's trace files."""

    actor: str = POLICY
    """Model key that generates rollouts: `policy` or a key of [orchestrator.models]. Default: policy."""

    algorithms: list[str] = Field(default_factory=lambda: ["grpo"], min_length=1)
    """Algorithms run on every group, in order. Default: ["grpo"]."""

    algorithm_args: dict[str, dict[str, Any]] = {}
    """Per-algorithm settings, e.g. `{grpo = {std_normalize = true}}`. Default: {}."""

    train: TrainConfig
    """Training rollouts: sampling and environments."""

    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""

    models: dict[str, ModelTargetConfig] = {}
    """Extra model targets (reference, opponent, judge, ...), keyed by name. Default: none."""

    members: list[MemberConfig] = []
    """Multi-agent members; empty for single-agent runs. Default: none."""

    multi_agent: MultiAgentConfig = MultiAgentConfig()
    """Multi-agent credit options."""

    filters: FiltersConfig = FiltersConfig()
    """Rollout filters."""

    warm_start: WarmStartConfig = WarmStartConfig()
    """Supervised warm start before RL."""

    @model_validator(mode="after")
    def _references(self) -> OrchestratorConfig:
        known = {POLICY, *self.models}
        if self.actor not in known:
            raise ValueError(
                f"orchestrator.actor {self.actor!r} is not `policy` or a key of orchestrator.models"
            )
        if POLICY in self.models:
            raise ValueError("orchestrator.models.policy is reserved for the live policy")
        names = [env.key for env in self.train.env]
        if len(set(names)) != len(names):
            raise ValueError(f"orchestrator.train.env names must be unique, got {names}")
        eval_names = [env.key for env in self.eval.env]
        if len(set(names + eval_names)) != len(names) + len(eval_names):
            raise ValueError(
                f"orchestrator.eval.env names must be unique and differ from the training envs' "
                f"(give an eval entry its own `name`), got train {names}, eval {eval_names}"
            )
        member_ids = [m.id for m in self.members]
        if len(set(member_ids)) != len(member_ids):
            raise ValueError(f"orchestrator.members ids must be unique, got {member_ids}")
        for i, member in enumerate(self.members):
            if member.model not in known:
                raise ValueError(
                    f"orchestrator.members.{i}.model {member.model!r} is not `policy` or a key of orchestrator.models"
                )
            if member.role == "train" and member.model != POLICY:
                raise ValueError(f"orchestrator.members.{i}: a `train` member must use model `policy`")
        if self.members and not any(m.role == "train" for m in self.members):
            raise ValueError("orchestrator.members needs at least one member with role `train`")
        if self.multi_agent.filter_by_learner_seat and not self.members:
            raise ValueError(
                "orchestrator.multi_agent.filter_by_learner_seat needs a multi-agent run (orchestrator.members)"
            )
        warm = self.warm_start
        if warm.max_steps and warm.actor != "oracle" and warm.actor not in known:
            raise ValueError(
                f"orchestrator.warm_start.actor {warm.actor!r} is not `oracle`, `policy` or a key of orchestrator.models"
            )
        return self

    @property
    def inflight_groups(self) -> int:
        return self.max_inflight_groups or self.batch_size * (self.max_off_policy_steps + 1)
