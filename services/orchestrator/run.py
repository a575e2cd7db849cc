"""The run: connect, resume, warm start, RL, finish.

A run always resumes from the trainer's newest checkpoint that its own records reach (step 0,
saved by a fresh trainer, for a new run): the orchestrator's state travels in the checkpoint
with the weights (each SubmitBatch carries the state as it will be once the batch trained),
so the pair always belongs to one step. When the trainer is lost mid-run (it died, or came
back at an older step), the run goes back to that checkpoint and carries on; steps after it
are trained again, and their metrics lines replaced.

Both training phases go through the same pipeline: the scheduler produces groups, the
algorithms credit them, filters and flattening cut a batch, and the trainer trains it. The
batch of step n+1 is collected while step n trains (when staleness allows it); step numbers
and versions are stamped on a batch only when it is submitted, so a step the trainer skips is
simply taken again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.types import Trace
from rlrun.common.wire import plan_to_proto, sample_to_proto
from rlrun.orchestrator import metrics
from rlrun.orchestrator.algorithms import AlgorithmDeps, BranchResult
from rlrun.orchestrator.batching import LOW_TRAIN_FRACTION, BuiltBatch, build_batch
from rlrun.orchestrator.connections import Connections, service_addresses, wait_ready
from rlrun.orchestrator.credit import CreditPipelines, EnvAlgorithmSpec
from rlrun.orchestrator.env_client import EnvDescription
from rlrun.orchestrator.evaluation import eval_tasks, run_eval
from rlrun.orchestrator.filters import RolloutFilters
from rlrun.orchestrator.group import RolloutGroup
from rlrun.orchestrator.outputs import EVAL_DIR, ROLLOUTS_DIR, RunOutputs, trace_row
from rlrun.orchestrator.plan import compile_plans, member_temperatures, samples_live_policy, trained_members
from rlrun.orchestrator.rollouts import EnvRollouts
from rlrun.orchestrator.sampler import EnvTasks, TaskSampler
from rlrun.orchestrator.scheduler import AllGroupsStale, GroupScheduler, GroupsFailing, SchedulerSettings
from rlrun.orchestrator.state import OrchestratorState
from rlrun.orchestrator.status import RunStatus
from rlrun.orchestrator.trainer_client import StepResult, TrainerLost
from rlrun.v1 import training_pb2

log = logging.getLogger(__name__)

MAX_BATCH_ATTEMPTS = 3
"""Attempts at a batch whose every rollout was filtered before the run fails."""
MAX_SKIPS_IN_A_ROW = 3
"""Consecutive steps the trainer may skip (non-finite loss) before the run fails."""


class RunFailed(RuntimeError):
    """A reason to stop the run that is not a bug: the message says what happened."""


class RunStopped(Exception):
    """Stop was requested while a batch was being collected."""


@dataclass
class Phase:
    name: str
    """`warmup` or `rl`: the phase of its metrics lines."""
    status_phase: str
    targets: dict[str, EnvRollouts]
    credit: CreditPipelines
    settings: SchedulerSettings
    max_steps: int
    learning_rate: float | None


@dataclass
class BuiltStep:
    batch: BuiltBatch
    proto: training_pb2.TrainingBatch
    gen_seconds: float
    build_seconds: float
    credit_state: dict[str, dict[str, Any]]
    """The phase's algorithm state right after crediting this batch: what a checkpoint taken
    once the batch trained saves (the next batch is already credited by then)."""


@dataclass
class StepOutcome:
    built: BuiltStep
    result: StepResult
    train_seconds: float
    off_policy_lag: int
    policy_version: int
    """The version the batch trained at."""


@dataclass
class EvalRecord:
    rl_step: int
    summary: dict[str, float] = field(default_factory=dict)


def describe_error(error: BaseException) -> str:
    """A one-line reason: the first leaf of an exception group, gRPC errors without their debug dump."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    if isinstance(error, grpc.aio.AioRpcError):
        return f"gRPC {error.code().name}: {error.details()}"
    if isinstance(error, RunFailed | ConfigError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def model_vocab_size(config: RunConfig) -> int:
    path = config.model.path / "config.json" if config.model.path is not None else config.model.config
    return int(json.loads(Path(path).read_text())["vocab_size"])


class Run:
    def __init__(self, config: RunConfig, status: RunStatus, options: ClientOptions | None = None):
        self.config = config
        self.orch = config.orchestrator
        self.status = status
        self.status.max_steps = self.orch.max_steps
        self.options = options or ClientOptions.from_config(config.grpc)
        self.outputs = RunOutputs(config.run_dir)
        self.connections: Connections | None = None
        self.stop_reason: str | None = None
        self._stop = asyncio.Event()
        self.trainer_step = 0
        self.version = 0
        self.state = OrchestratorState(trainer_step=0, policy_version=0)
        self.resumes = 0
        """Times this process went back to a checkpoint after losing the trainer."""
        self._checkpointed_at = -1
        self._skips_in_a_row = 0
        self._last_step_end = 0.0
        self._stale_before = 0
        self._scheduler: GroupScheduler | None = None
        self._last_eval: EvalRecord | None = None
        self._nonce = secrets.token_hex(3)  # group ids stay unique across restarts of this process

    # -- control ----------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        if self.status.finished or self.stop_reason is not None:
            return
        log.info("stop requested: %s", reason)
        self.stop_reason = reason
        self.status.phase = "stopping"
        self._stop.set()

    async def execute(self) -> None:
        """Runs to the end; the outcome is in `status` (never raises except on cancellation)."""
        try:
            descriptions = await self._connect()
            self._prepare(descriptions)
            while True:
                await self._resume()
                try:
                    await self._phases()
                    break
                except TrainerLost as lost:
                    self.resumes += 1
                    log.warning("lost the trainer (%s); resuming from its checkpoint", lost)
            await self._finish()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await self._fail(error)
        finally:
            if self.connections is not None:
                await self.connections.close()

    async def _phases(self) -> None:
        if self.plans.warmup and not self.state.warmup_done:
            if self.stop_reason is None:
                self.status.phase = "warmup"
            await self._train_phase(self._warmup_phase())
            if self.stop_reason is None:
                self.state.warmup_done = True
                await self._checkpoint()  # a resume must not take the warm start up again
        if self.stop_reason is None:
            self.status.phase = "running"
            await self._rl()
        if self._checkpointed_at != self.trainer_step:
            await self._checkpoint()

    # -- start --------------------------------------------------------------------------------------

    async def _connect(self) -> dict[str, EnvDescription]:
        addresses = service_addresses(self.config)
        log.info(
            "waiting for %d services: %s", len(addresses), ", ".join(f"{k}={v}" for k, v in addresses.items())
        )
        await wait_ready(addresses, self.options, self.orch.startup_timeout_s)
        self.connections = Connections(self.config, self.options)
        envs = self.orch.train.env
        found = await asyncio.gather(*(self.connections.envs[e.key].describe(e.key, e.id) for e in envs))
        return {env.key: description for env, description in zip(envs, found, strict=True)}

    def _prepare(self, descriptions: dict[str, EnvDescription]) -> None:
        orch = self.orch
        assert self.connections is not None
        self.descriptions = descriptions
        self._check_members(descriptions)
        self.plans = compile_plans(self.config)
        self._env_by_id = {d.env_id: self.connections.envs[key] for key, d in descriptions.items()}
        deps = AlgorithmDeps(
            scorer=self.connections.scorer,
            render_message=self._render_message,
            model_concurrency=self.connections.model_concurrency,
        )
        members = [m.id for m in orch.members]
        specs = []
        for i, env in enumerate(orch.train.env):
            description = descriptions[env.key]
            where = f"orchestrator.train.env.{i}.algorithms" if env.algorithms else "orchestrator.algorithms"
            specs.append(
                EnvAlgorithmSpec(
                    env.key,
                    description.env_id,
                    list(env.algorithms or orch.algorithms),
                    description.algorithms,
                    description.members or members,
                    where,
                )
            )
        self.credit = CreditPipelines(specs, orch.algorithm_args, deps, self._run_algorithms)
        # The RL algorithms' state as of the last RL batch that trained: what checkpoints save.
        self._credit_state = self.credit.state_dict()
        self.warm_credit = (
            CreditPipelines(
                [
                    EnvAlgorithmSpec(
                        s.env,
                        s.env_id,
                        [orch.warm_start.algorithm],
                        s.owned,
                        s.members,
                        "orchestrator.warm_start.algorithm",
                    )
                    for s in specs
                ],
                orch.algorithm_args,
                deps,
                self._run_algorithms,
            )
            if self.plans.warmup
            else None
        )
        held_out = orch.warm_start.dev_tasks if self.plans.warmup else 0
        self.sampler = TaskSampler(
            [
                EnvTasks(env.key, env.ratio, self._task_count(env.key, "train"), held_out)
                for env in orch.train.env
            ],
            orch.seed,
        )
        if orch.eval.enabled:
            for env in orch.train.env:
                self._task_count(env.key, "eval")
        vocab = model_vocab_size(self.config)
        self.filters = RolloutFilters(orch.filters, vocab)
        self.eval_targets = self._targets(self.plans.eval)
        self.dev_targets = self._targets(self.plans.dev)
        # What a run resumed at step 0 (a fresh trainer's checkpoint) starts from.
        self._initial = OrchestratorState(
            trainer_step=0,
            policy_version=0,
            sampler=self.sampler.state(),
            algorithms=self.credit.state_dict(),
        )

    def _check_members(self, descriptions: dict[str, EnvDescription]) -> None:
        configured = sorted(m.id for m in self.orch.members)
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

    def _task_count(self, env: str, split: str) -> int:
        counts = self.descriptions[env].task_counts
        if counts.get(split, 0) <= 0:
            raise RunFailed(f"env {env!r} reports no {split!r} tasks (task counts: {counts})")
        return counts[split]

    def _render_message(self, role: str, text: str) -> list[int]:
        if not hasattr(self, "_tokenizer"):
            from rlrun.common.tokenizer import load_tokenizer  # loaded only by algorithms that render text

            self._tokenizer = load_tokenizer(self.config.model.tokenizer, self.config.model.path)
        return self._tokenizer.render_message(role, text)

    async def _run_algorithms(self, env_id: str, ids: list[str], traces: list[Trace]) -> list[BranchResult]:
        return await self._env_by_id[env_id].run_algorithms(env_id, ids, traces)

    def _targets(self, plans: dict[str, Any]) -> dict[str, EnvRollouts]:
        assert self.connections is not None
        out = {}
        for key, plan in plans.items():
            out[key] = EnvRollouts(
                env=key,
                client=self.connections.envs[key],
                plan=plan_to_proto(plan),
                trained_members=trained_members(plan, self.orch.multi_agent.drop_judge),
                temperatures=member_temperatures(plan, self.descriptions[key].temperature),
                learner_seat_only=self.orch.multi_agent.filter_by_learner_seat,
            )
        return out

    async def _resume(self) -> None:
        """Goes back to the trainer's newest checkpoint that this run's records reach: the
        step of the last metrics line written (none: the trainer's newest), so the metrics
        stay gap-free; the trainer rolls back to it if it has moved on."""
        assert self.connections is not None
        recorded = self.outputs.recorded_trainer_step()
        back = await self.connections.trainer.rollback(recorded)
        if back.resume_state:
            state = OrchestratorState.from_bytes(back.resume_state)
        elif back.step == 0:
            state = dataclasses.replace(self._initial, policy_version=back.version)
        else:
            raise RunFailed(
                f"the trainer's checkpoint {back.checkpoint or 'at step ' + str(back.step)} holds no "
                "orchestrator state; start the run over with --fresh"
            )
        if state.trainer_step != back.step:
            raise RunFailed(
                f"the trainer is at step {back.step} but the orchestrator state saved with it is for "
                f"step {state.trainer_step}"
            )
        self.trainer_step, self.version = back.step, back.version
        self.sampler.load_state(state.sampler)
        self.credit.load_state_dict(state.algorithms)
        self._credit_state = state.algorithms
        self.state = state
        self._stale_before = state.groups_dropped_stale
        self._checkpointed_at = back.step
        self._last_eval = None
        self.outputs.resume_after(back.step, state.warmup_steps, state.rl_steps)
        self.status.step = state.rl_steps
        self.status.version = back.version
        self.status.resumes = self.resumes
        if back.step:
            log.info(
                "resumed at trainer step %d (warm-start steps %d, rl steps %d, version %d)%s",
                back.step,
                state.warmup_steps,
                state.rl_steps,
                back.version,
                f" from {back.checkpoint}" if back.checkpoint else "",
            )
        else:
            log.info("starting at step 0 in %s", self.outputs.run_dir)

    # -- phases -------------------------------------------------------------------------------------

    def _warmup_phase(self) -> Phase:
        warm, orch = self.orch.warm_start, self.orch
        plan = next(iter(self.plans.warmup.values()))
        live = samples_live_policy(plan)
        assert self.warm_credit is not None
        return Phase(
            name="warmup",
            status_phase="warmup",
            targets=self._targets(self.plans.warmup),
            credit=self.warm_credit,
            settings=SchedulerSettings(
                batch_size=warm.batch_size,
                group_size=1,
                max_off_policy_steps=orch.max_off_policy_steps
                if live
                else 1,  # a fixed actor never goes stale
                enforce_staleness=live,
                inflight_limit=2 * warm.batch_size,
                max_retries=orch.max_retries,
                timeout_s=orch.rollout_timeout_s,
                group_failures=orch.group_failures,
                id_prefix=f"warmup-{self._nonce}-t{self.trainer_step}",
            ),
            max_steps=warm.max_steps,
            learning_rate=warm.lr,
        )

    async def _rl(self) -> None:
        orch = self.orch
        if orch.eval.enabled and self.state.rl_steps == 0 and self.state.eval_reward_start is None:
            summary = await self._evaluate(rl_step=0)
            self.state.eval_reward_start = summary["eval_reward"]
            self.state.win_rate_start = summary.get("win_rate")
        plan = next(iter(self.plans.train.values()))
        phase = Phase(
            name="rl",
            status_phase="running",
            targets=self._targets(self.plans.train),
            credit=self.credit,
            settings=SchedulerSettings(
                batch_size=orch.batch_size,
                group_size=orch.group_size,
                max_off_policy_steps=orch.max_off_policy_steps,
                enforce_staleness=samples_live_policy(plan),
                inflight_limit=orch.inflight_groups,
                max_retries=orch.max_retries,
                timeout_s=orch.rollout_timeout_s,
                group_failures=orch.group_failures,
                id_prefix=f"rl-{self._nonce}-t{self.trainer_step}",
            ),
            max_steps=orch.max_steps,
            learning_rate=None,
        )
        await self._train_phase(phase)
        finished = self.stop_reason is None and self.state.rl_steps >= orch.max_steps
        if (
            finished
            and orch.eval.enabled
            and (self._last_eval is None or self._last_eval.rl_step != self.state.rl_steps)
        ):
            await self._evaluate(rl_step=self.state.rl_steps)

    def _phase_steps(self, phase: Phase) -> int:
        return self.state.warmup_steps if phase.name == "warmup" else self.state.rl_steps

    async def _train_phase(self, phase: Phase) -> None:
        scheduler = GroupScheduler(phase.settings, phase.targets, self.sampler)
        self._scheduler = scheduler
        scheduler.start(self.version)
        pending: asyncio.Task[StepOutcome] | None = None
        self._last_step_end = time.monotonic()
        try:
            while True:
                built = None
                if (
                    self._phase_steps(phase) + (pending is not None) < phase.max_steps
                    and self.stop_reason is None
                ):
                    try:
                        built = await self._collect(
                            scheduler, phase, target=self.version + (pending is not None), training=pending
                        )
                    except RunStopped:
                        built = None
                if pending is not None:
                    outcome, pending = await pending, None
                    if await self._after_step(phase, outcome):
                        break
                if built is None:
                    if self._phase_steps(phase) < phase.max_steps and self.stop_reason is None:
                        continue  # the trainer skipped a step: take it again
                    break
                pending = asyncio.create_task(self._train(built, phase, scheduler))
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await scheduler.close()
            self._stale_before += scheduler.dropped_stale
            self.state.groups_dropped_stale = self._stale_before
            self._scheduler = None

    async def _take(self, scheduler: GroupScheduler, training: asyncio.Task | None) -> RolloutGroup:
        """The next group; raises RunStopped on Stop, and the training step's error as soon as it
        fails (a synchronous run would otherwise wait for groups that are never dispatched)."""
        take = asyncio.ensure_future(scheduler.take())
        stop = asyncio.ensure_future(self._stop.wait())
        watched = {take, stop} | ({training} if training is not None else set())
        try:
            while True:
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if take in done:
                    return take.result()
                if stop in done:
                    raise RunStopped
                if training is not None and training in done:
                    training.result()  # raises the step's error, if any
                    watched.discard(training)
        finally:
            stop.cancel()
            if not take.done():
                take.cancel()
                await asyncio.gather(take, return_exceptions=True)

    async def _collect(
        self, scheduler: GroupScheduler, phase: Phase, target: int, training: asyncio.Task | None
    ) -> BuiltStep:
        for attempt in range(1, MAX_BATCH_ATTEMPTS + 1):
            scheduler.begin_batch(target)
            started = time.monotonic()
            credit_seconds = 0.0
            groups = []
            while len(groups) < phase.settings.batch_size:
                group = await self._take(scheduler, training)
                credit_started = time.monotonic()
                await phase.credit.apply(group)
                credit_seconds += time.monotonic() - credit_started
                groups.append(group)
            build_started = time.monotonic()
            batch = build_batch(groups, self.filters)
            for (name, env), count in batch.flagged.items():
                metrics.FILTERED.labels(filter=name, env=env).inc(count)
            if batch.samples:
                proto = training_pb2.TrainingBatch(samples=[sample_to_proto(s) for s in batch.samples])
                build_seconds = credit_seconds + time.monotonic() - build_started
                metrics.BATCH_BUILD.observe(build_seconds)
                return BuiltStep(
                    batch,
                    proto,
                    build_started - started - credit_seconds,
                    build_seconds,
                    phase.credit.state_dict(),
                )
            metrics.EMPTY_BATCHES.inc()
            rates = ", ".join(
                f"{k.removeprefix('filter/').removesuffix('_ratio')} flagged {v:.0%}"
                for k, v in batch.metrics.items()
                if k.startswith("filter/")
            )
            log.warning(
                "attempt %d/%d: all %d rollouts of the batch were filtered (%s); regenerating",
                attempt,
                MAX_BATCH_ATTEMPTS,
                batch.rollouts,
                rates,
            )
        raise RunFailed(
            f"every rollout of {MAX_BATCH_ATTEMPTS} consecutive batches was filtered, nothing to train "
            f"(last batch: {batch.rollouts} rollouts; {rates or 'no filter flagged them: no algorithm credited any token'})"
        )

    async def _train(self, built: BuiltStep, phase: Phase, scheduler: GroupScheduler) -> StepOutcome:
        assert self.connections is not None
        step, version = self.trainer_step, self.version
        live = phase.settings.enforce_staleness
        lag = version - built.batch.policy_start if live else 0
        proto = built.proto
        proto.step, proto.policy_version = step, version
        if phase.learning_rate is not None:
            proto.learning_rate = phase.learning_rate
        proto.metrics.clear()
        proto.metrics.update({**built.batch.metrics, "off_policy_lag": float(lag)})
        if live:
            for group in built.batch.groups:
                metrics.OFF_POLICY.observe(version - group.policy_start)
        started = time.monotonic()
        result = await self.connections.trainer.submit(proto, self._state_after(built, phase).to_bytes())
        train_seconds = time.monotonic() - started
        if not result.skipped and result.step != step + 1:
            raise RunFailed(
                f"the trainer answered step {result.step} to batch step {step}; expected {step + 1}"
            )
        self.trainer_step, self.version = result.step, result.version
        scheduler.set_version(result.version)
        return StepOutcome(built, result, train_seconds, lag, version)

    def _state_after(self, built: BuiltStep, phase: Phase) -> OrchestratorState:
        """The state as it will be once `built` trained: what a trainer checkpoint of that
        step saves (the step's wall time is not known yet and is left out)."""
        state = dataclasses.replace(
            self.state,
            trainer_step=self.trainer_step + 1,
            policy_version=self.version + 1,
            sampler=self.sampler.state(),
            algorithms=self._credit_state,
            groups_dropped_stale=self._groups_dropped_stale(),
        )
        if phase.name == "warmup":
            state.warmup_steps += 1
        else:
            state.rl_steps += 1
            state.algorithms = built.credit_state
            state.rl_tokens += built.batch.generated_tokens
            if state.train_reward_start is None:
                state.train_reward_start = built.batch.metrics.get("reward_mean")
        return state

    async def _after_step(self, phase: Phase, outcome: StepOutcome) -> bool:
        """Records a finished step; runs the evals and checkpoints due. True ends the phase."""
        now = time.monotonic()
        step_seconds, self._last_step_end = now - self._last_step_end, now
        result, batch = outcome.result, outcome.built.batch
        if result.skipped:
            self._skips_in_a_row += 1
            metrics.SKIPPED_STEPS.inc()
            log.warning("the trainer skipped step %d: %s", self.trainer_step, result.skip_reason)
            if self._skips_in_a_row >= MAX_SKIPS_IN_A_ROW:
                raise RunFailed(
                    f"the trainer skipped {self._skips_in_a_row} steps in a row: {result.skip_reason}"
                )
            return False
        self._skips_in_a_row = 0
        for failure in result.broadcast_failures:
            log.error("weights of version %d did not reach %s", result.version, failure)
        if phase.name == "warmup":
            self.state.warmup_steps += 1
        else:
            self.state.rl_steps += 1
            self._credit_state = outcome.built.credit_state
        number = self._phase_steps(phase)
        tokens = batch.generated_tokens
        line: dict[str, Any] = {
            "step": number,
            "trainer_step": self.trainer_step,
            "phase": phase.name,
            "policy_version": result.version,
            **batch.metrics,
            "off_policy_lag": outcome.off_policy_lag,
            "groups_dropped_stale": self._groups_dropped_stale(),
            "step_seconds": step_seconds,
            "gen_seconds": outcome.built.gen_seconds,
            "train_seconds": outcome.train_seconds,
            "batch_build_seconds": outcome.built.build_seconds,
            "tokens_per_s": tokens / step_seconds if step_seconds > 0 else 0.0,
            **{f"trainer/{k}": v for k, v in result.metrics.items()},
        }
        if batch.trained_fraction <= LOW_TRAIN_FRACTION:
            log.warning(
                "only %.0f%% of the batch's %d rollouts train (filtered %.0f%%)",
                100 * batch.trained_fraction,
                batch.rollouts,
                100 * batch.metrics["filtered_ratio"],
            )
        self._publish(phase, line, batch)
        if phase.name == "rl":
            self.state.rl_tokens += tokens
            self.state.rl_seconds += step_seconds
            if self.state.train_reward_start is None:
                self.state.train_reward_start = batch.metrics.get("reward_mean")
            self.outputs.track_rollouts(number, [t for g in batch.groups for t in g.traces])
            interval = self.orch.save_rollouts_interval
            if interval and number % interval == 0:
                self.outputs.write_rows(
                    ROLLOUTS_DIR,
                    f"step_{number}",
                    [trace_row(t) for g in batch.groups for t in g.traces],
                )
        end_phase = await self._evals_due(phase, number, line)
        self.outputs.append_metrics(line)
        log.info(
            "%s step %d/%d (trainer step %d, version %d): reward %.3f, %d tokens, lag %d, %.2fs",
            phase.name,
            number,
            phase.max_steps,
            self.trainer_step,
            result.version,
            batch.metrics.get("reward_mean", 0.0),
            tokens,
            outcome.off_policy_lag,
            step_seconds,
        )
        self._last_step_end = time.monotonic()  # evals and checkpoints do not count as step time
        return end_phase or self.stop_reason is not None

    async def _evals_due(self, phase: Phase, number: int, line: dict[str, Any]) -> bool:
        if phase.name == "warmup":
            warm = self.orch.warm_start
            if number % warm.eval_interval and number < phase.max_steps:
                return False
            dev = await self._evaluate_dev(number)
            line["dev_reward"] = dev
            if warm.target_reward is not None and dev >= warm.target_reward:
                log.info(
                    "warm start reached dev reward %.3f >= %.3f after %d steps",
                    dev,
                    warm.target_reward,
                    number,
                )
                return True
            return False
        ev = self.orch.eval
        if ev.enabled and ((ev.interval and number % ev.interval == 0) or number == phase.max_steps):
            summary = await self._evaluate(rl_step=number)
            line["eval_reward"] = summary["eval_reward"]
            if "win_rate" in summary:
                line["win_rate"] = summary["win_rate"]
        return False

    def _groups_dropped_stale(self) -> int:
        return self._stale_before + (self._scheduler.dropped_stale if self._scheduler is not None else 0)

    def _publish(self, phase: Phase, line: dict[str, Any], batch: BuiltBatch) -> None:
        st, m = self.status, batch.metrics
        st.version = line["policy_version"]
        st.off_policy_lag = int(line["off_policy_lag"])
        st.tokens_per_s = line["tokens_per_s"]
        st.groups_dropped_stale = line["groups_dropped_stale"]
        st.metrics = {
            k: float(v) for k, v in line.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if phase.name == "rl":
            st.step = line["step"]
            # Only RL batches: a warm start's rollouts are the oracle's, whose reward says
            # nothing about the policy.
            st.train_reward = m.get("reward_mean", 0.0)
            metrics.RL_STEPS.set(line["step"])
            metrics.TRAIN_REWARD.set(st.train_reward)
        else:
            metrics.WARMUP_STEPS.set(line["step"])
        metrics.POLICY_VERSION.set(st.version)
        metrics.FILTERED_RATIO.set(m["filtered_ratio"])
        metrics.TOKENS_PER_SECOND.set(st.tokens_per_s)
        metrics.GENERATED_TOKENS.inc(batch.generated_tokens)
        metrics.STEP_SECONDS.observe(line["step_seconds"])
        for group in batch.groups:
            metrics.ROLLOUTS.labels(env=group.env).inc(len(group.trained_traces))
        if "advantage_mean" in m:
            metrics.ADVANTAGE_MEAN.set(m["advantage_mean"])
            metrics.ADVANTAGE_STD.set(m["advantage_std"])
            metrics.ADVANTAGE_ABS_MAX.set(max(abs(m["advantage_min"]), abs(m["advantage_max"])))

    # -- evals --------------------------------------------------------------------------------------

    async def _run_eval(
        self,
        targets: dict[str, EnvRollouts],
        split: str,
        num_tasks: int,
        k: int,
        name: str,
        file: str,
        rl_step: int,
        counts: dict[str, int],
    ) -> dict[str, float]:
        started = time.monotonic()
        tasks = eval_tasks(counts, split, num_tasks)
        result = await run_eval(
            targets,
            tasks,
            k=k,
            solved_threshold=self.orch.eval.solved_threshold,
            concurrency=self.orch.inflight_groups,
            max_retries=self.orch.max_retries,
            timeout_s=self.orch.rollout_timeout_s,
            id_prefix=f"{name}-{self._nonce}-t{self.trainer_step}",
            version=self.version,
            name=name,
        )
        self.outputs.write_rows(
            EVAL_DIR,
            file,
            [{"step": rl_step, "trainer_step": self.trainer_step, **row} for row in result.rows],
        )
        summary = result.summary
        if summary["failed_groups"]:
            log.warning(
                "%s after step %d: %d of %d groups failed and are left out of the reward",
                name,
                rl_step,
                int(summary["failed_groups"]),
                len(tasks),
            )
        metrics.EVAL_REWARD.set(summary[f"{name}_reward"])
        self.outputs.append_metrics(
            {
                "step": rl_step,
                "trainer_step": self.trainer_step,
                "phase": name,
                "split": split,
                **summary,
                "eval_seconds": time.monotonic() - started,
            }
        )
        log.info(
            "%s after step %d: reward %.3f, pass@%d %.3f over %d tasks",
            name,
            rl_step,
            summary[f"{name}_reward"],
            k,
            summary["pass_at_k"],
            int(summary["tasks"]),
        )
        return summary

    async def _evaluate(self, rl_step: int) -> dict[str, float]:
        ev = self.orch.eval
        counts = {key: d.task_counts["eval"] for key, d in self.descriptions.items()}
        k = 1 if ev.greedy else ev.pass_k
        summary = await self._run_eval(
            self.eval_targets, "eval", ev.num_tasks, k, "eval", f"step_{rl_step}", rl_step, counts
        )
        self._last_eval = EvalRecord(rl_step, summary)
        self.status.eval_reward = summary["eval_reward"]
        return summary

    async def _evaluate_dev(self, warm_step: int) -> float:
        counts = {key: d.task_counts["train"] for key, d in self.descriptions.items()}
        summary = await self._run_eval(
            self.dev_targets,
            "train",
            self.orch.warm_start.dev_tasks,
            1,
            "dev",
            f"dev_step_{warm_step}",
            warm_step,
            counts,
        )
        self.state.dev_reward = summary["dev_reward"]
        self.status.eval_reward = summary["dev_reward"]
        return summary["dev_reward"]

    # -- checkpoints and the end --------------------------------------------------------------------

    async def _checkpoint(self) -> None:
        assert self.connections is not None
        state = self.state
        state.trainer_step, state.policy_version = self.trainer_step, self.version
        state.sampler = self.sampler.state()
        state.algorithms = self._credit_state
        state.groups_dropped_stale = self._groups_dropped_stale()
        path = await self.connections.trainer.save_checkpoint(state.to_bytes(), self.trainer_step)
        self._checkpointed_at = self.trainer_step
        log.info("checkpoint at trainer step %d: %s", self.trainer_step, path)

    async def _finish(self) -> None:
        if self.stop_reason is not None:
            self.status.last_error = f"stopped by request: {self.stop_reason}"
            self.status.phase = "failed"
        else:
            self.status.phase = "succeeded"
        self.outputs.write_summary(self._summary())
        log.info("run %s after %d rl steps", self.status.phase, self.state.rl_steps)

    async def _fail(self, error: Exception) -> None:
        reason = describe_error(error)
        expected = isinstance(error, RunFailed | ConfigError | TimeoutError | GroupsFailing | AllGroupsStale)
        log.error("run failed: %s", reason, exc_info=None if expected else error)
        self.status.phase = "failed"
        self.status.last_error = reason
        details = "" if expected else "\n\n" + "".join(traceback.format_exception(error))
        try:
            self.outputs.write_error(reason + details)
            self.outputs.write_summary(self._summary())
        except OSError as write_error:
            log.error("could not write the failure to %s: %s", self.outputs.run_dir, write_error)

    def _summary(self) -> dict[str, Any]:
        state, last = self.state, self._last_eval
        multi_agent = (
            {
                "win_rate_start": state.win_rate_start,
                "win_rate_end": last.summary.get("win_rate") if last else None,
            }
            if self.orch.members
            else {}
        )
        return {
            "phase": self.status.phase,
            "steps": state.rl_steps,
            "max_steps": self.orch.max_steps,
            "warmup_steps": state.warmup_steps,
            "trainer_steps": self.trainer_step,
            "policy_version": self.version,
            "eval_reward_start": state.eval_reward_start,
            "eval_reward_end": last.summary["eval_reward"] if last else None,
            "pass_at_k_end": last.summary["pass_at_k"] if last else None,
            "dev_reward": state.dev_reward,
            "train_reward_start": state.train_reward_start,
            "train_reward_end": self.status.train_reward if state.rl_steps else None,
            "tokens_per_s": state.rl_tokens / state.rl_seconds if state.rl_seconds > 0 else 0.0,
            "rl_seconds": state.rl_seconds,
            "groups_dropped_stale": self._groups_dropped_stale(),
            **multi_agent,
            "last_error": self.status.last_error,
        }
