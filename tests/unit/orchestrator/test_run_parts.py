"""The parts of the orchestrator's run (progress, phases, checkpointer, recorder, step loop)
against fakes: no gRPC, no services."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from rlrun.common.config.orchestrator import FiltersConfig, OrchestratorConfig, TracesConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.common.wire.trainer import Resumed, StepResult
from rlrun.common.wire.training import encode_batch
from rlrun.orchestrator.collect.sampler import EnvTasks, TaskSampler
from rlrun.orchestrator.credit.algorithms import AlgorithmDeps
from rlrun.orchestrator.credit.batching import build_batch
from rlrun.orchestrator.credit.filters import RolloutFilters
from rlrun.orchestrator.credit.pipeline import CreditPipelines, EnvAlgorithmSpec
from rlrun.orchestrator.run.checkpointer import Checkpointer
from rlrun.orchestrator.run.loop import MAX_SKIPS_IN_A_ROW, StepLoop
from rlrun.orchestrator.run.outputs import RunOutputs
from rlrun.orchestrator.run.phase import RLPhase, WarmupPhase, rl_phase, warmup_phase
from rlrun.orchestrator.run.progress import Progress
from rlrun.orchestrator.run.recorder import Recorder
from rlrun.orchestrator.run.state import OrchestratorState
from rlrun.orchestrator.run.step import BuiltStep, RunFailed
from rlrun.orchestrator.run.traces import TokenTexts, TraceWriter

ORCH = OrchestratorConfig.model_validate(
    {"batch_size": 2, "group_size": 2, "max_steps": 3, "train": {"env": [{"id": "rev"}]}}
)


def recorder(status: RunStatus, outputs: RunOutputs, progress: Progress) -> Recorder:
    """A recorder that writes no trace files (they need an inference replica to decode tokens:
    tests/integration/orchestrator/test_trace_files.py)."""
    off = TraceWriter(
        TracesConfig(groups_per_step=0, dropped_per_step=0), outputs, TokenTexts([], ClientOptions())
    )
    return Recorder(ORCH, status, outputs, progress, off)


async def no_env_algorithms(env_id, ids, traces):
    raise AssertionError("no env-owned algorithm in these tests")


def credit() -> CreditPipelines:
    spec = EnvAlgorithmSpec(env="rev", env_id="rev-id", ids=["grpo"], owned=[], members=[])
    return CreditPipelines([spec], {}, AlgorithmDeps(), no_env_algorithms)


def context(initial: OrchestratorState | None = None):
    sampler = TaskSampler([EnvTasks("rev", 1.0, 100, 0)], seed=0)
    pipelines = credit()
    return SimpleNamespace(
        sampler=sampler,
        credit=pipelines,
        initial=initial
        or OrchestratorState(0, 0, sampler=sampler.state(), algorithms=pipelines.state_dict()),
    )


class FakeTrainer:
    def __init__(self, back: Resumed | None = None):
        self.back = back or Resumed(0, 0, "", b"")
        self.rollbacks: list[int | None] = []
        self.saved: list[tuple[int, OrchestratorState]] = []
        self.submitted: list[dict] = []
        self.skip: list[bool] = []
        self.step = self.back.step

    async def rollback(self, max_step):
        self.rollbacks.append(max_step)
        return self.back

    async def save_checkpoint(self, extra_state: bytes, step: int) -> str:
        self.saved.append((step, OrchestratorState.from_bytes(extra_state)))
        return f"checkpoints/step_{step}"

    async def submit(self, batch, *, step, version, learning_rate, metrics, orchestrator_state):
        self.submitted.append(
            {
                "step": step,
                "version": version,
                "lr": learning_rate,
                "samples": len(batch.message.samples),
                "state": OrchestratorState.from_bytes(orchestrator_state),
                "metrics": dict(metrics),
            }
        )
        if self.skip and self.skip.pop(0):
            return StepResult(self.step, self.step, True, "loss is nan")
        self.step += 1
        return StepResult(self.step, self.step, False, "", {"loss": 0.5})


def built_step(build, rewards=(1.0, 0.0), credit_state=None) -> BuiltStep:
    group = build.group([build.trace(f"t{i}", r) for i, r in enumerate(rewards)])
    return BuiltStep(
        build_batch([group], RolloutFilters(FiltersConfig(), 64)),
        encode_batch([]),
        0.1,
        0.01,
        credit_state or {"grpo": {"seen": 1}},
    )


# -- progress ------------------------------------------------------------------------------------


def test_progress_owns_step_version_and_stale_count():
    progress = Progress()
    progress.moved_to(4, 5)
    assert (progress.trainer_step, progress.version) == (4, 5)
    assert (progress.state.trainer_step, progress.state.policy_version) == (4, 5)
    scheduler = SimpleNamespace(dropped_stale=3)
    progress.phase_started(scheduler)
    assert progress.groups_dropped_stale() == 3
    scheduler.dropped_stale = 4
    progress.phase_ended(scheduler)
    assert progress.groups_dropped_stale() == 4 and progress.state.groups_dropped_stale == 4
    progress.restart_from(OrchestratorState(2, 2, groups_dropped_stale=1))
    assert progress.trainer_step == 2 and progress.groups_dropped_stale() == 1


# -- phases --------------------------------------------------------------------------------------


def test_phases_count_their_own_steps(build):
    warm = warmup_phase(ORCH, {}, credit(), live=False, id_prefix="w")
    rl = rl_phase(ORCH, {}, credit(), live=True, id_prefix="r")
    assert isinstance(warm, WarmupPhase) and isinstance(rl, RLPhase)
    assert warm.settings.group_size == 1 and warm.settings.max_off_policy_steps == 1 and not warm.live
    assert rl.settings.group_size == 2 and rl.live and rl.learning_rate is None
    state = OrchestratorState(0, 0)
    built = built_step(build, credit_state={"grpo": {"x": 1}})
    warm.count_step(state, built, 2.0)
    assert (state.warmup_steps, state.rl_steps, state.algorithms, state.rl_seconds) == (1, 0, {}, 0.0)
    rl.count_step(state, built, 2.0)
    assert (state.warmup_steps, state.rl_steps, state.rl_seconds) == (1, 1, 2.0)
    assert state.algorithms == {"grpo": {"x": 1}} and state.rl_tokens == built.batch.generated_tokens > 0
    assert state.train_reward_start == 0.5
    assert warm.steps_done(state) == 1 and rl.steps_done(state) == 1
    assert rl.keeps_rollouts() and not warm.keeps_rollouts()
    assert rl.more_to_take(state, pending=True) and not rl.more_to_take(
        OrchestratorState(0, 0, rl_steps=2), pending=True
    )


# -- checkpointer --------------------------------------------------------------------------------


def make_checkpointer(tmp_path, back: Resumed, initial=None):
    ctx = context(initial)
    progress = Progress()
    trainer = FakeTrainer(back)
    return Checkpointer(trainer, ctx, progress, RunOutputs(tmp_path)), trainer, progress, ctx


async def test_resume_at_step_0_starts_from_the_initial_state(tmp_path):
    checkpointer, trainer, progress, ctx = make_checkpointer(tmp_path, Resumed(0, 7, "", b""))
    back = await checkpointer.resume()
    assert back.step == 0 and trainer.rollbacks == [None]  # no metrics.jsonl: the newest
    assert (progress.trainer_step, progress.version) == (0, 7)
    assert progress.state.sampler == ctx.initial.sampler and not checkpointer.behind


async def test_resume_loads_the_state_saved_with_the_checkpoint(tmp_path):
    saved = OrchestratorState(5, 5, rl_steps=5, groups_dropped_stale=2, algorithms={"grpo": {}})
    saved.sampler = context().sampler.state()
    (tmp_path / "metrics.jsonl").write_text('{"phase": "rl", "trainer_step": 6, "step": 6}\n')
    checkpointer, trainer, progress, _ = make_checkpointer(
        tmp_path, Resumed(5, 5, "checkpoints/step_5", saved.to_bytes())
    )
    await checkpointer.resume()
    assert trainer.rollbacks == [6]  # the last step its records reach
    assert progress.state.rl_steps == 5 and progress.groups_dropped_stale() == 2
    progress.moved_to(6, 6)
    assert checkpointer.behind
    await checkpointer.save()
    assert trainer.saved[-1][0] == 6 and trainer.saved[-1][1].trainer_step == 6 and not checkpointer.behind


@pytest.mark.parametrize(
    ("back", "message"),
    [
        (Resumed(5, 5, "checkpoints/step_5", b""), "checkpoints/step_5 holds no orchestrator state"),
        (Resumed(5, 5, "", OrchestratorState(4, 4).to_bytes()), "state saved with it is for step 4"),
    ],
)
async def test_resume_refuses_a_checkpoint_without_matching_state(tmp_path, back, message):
    checkpointer, *_ = make_checkpointer(tmp_path, back)
    with pytest.raises(RunFailed, match=message):
        await checkpointer.resume()


def test_state_after_is_the_state_once_the_batch_trained(tmp_path, build):
    checkpointer, _, progress, _ = make_checkpointer(tmp_path, Resumed(0, 0, "", b""))
    progress.moved_to(3, 3)
    built = built_step(build, credit_state={"grpo": {"n": 2}})
    rl = rl_phase(ORCH, {}, credit(), live=True, id_prefix="r")
    after = checkpointer.state_after(built, rl)
    assert (after.trainer_step, after.policy_version, after.rl_steps) == (4, 4, 1)
    assert after.algorithms == {"grpo": {"n": 2}} and after.rl_seconds == 0.0
    assert progress.state.rl_steps == 0 and progress.trainer_step == 3  # the live state is untouched
    warm = warmup_phase(ORCH, {}, credit(), live=False, id_prefix="w")
    assert checkpointer.state_after(built, warm).warmup_steps == 1


# -- recorder ------------------------------------------------------------------------------------


def test_recorder_publishes_rl_steps_and_writes_the_summary(tmp_path, build):
    status, progress = RunStatus(), Progress()
    rec = recorder(status, RunOutputs(tmp_path), progress)
    built = built_step(build)
    outcome = SimpleNamespace(
        built=built, result=StepResult(1, 1, False, "", {"loss": 0.5}), train_seconds=0.2, off_policy_lag=1
    )
    progress.moved_to(1, 1)
    rl = rl_phase(ORCH, {}, credit(), live=True, id_prefix="r")
    record = rec.step_record(rl, 1, outcome, step_seconds=2.0, dropped={"stale": 2})
    assert record.line["groups_dropped/stale"] == 2
    assert (
        record.line["trainer/loss"] == 0.5 and record.line["tokens_per_s"] == built.batch.generated_tokens / 2
    )
    rec.publish(rl, record)
    assert status.step == 1 and status.train_reward == 0.5 and status.version == 1
    warm = warmup_phase(ORCH, {}, credit(), live=False, id_prefix="w")
    status.step = 0
    rec.publish(warm, rec.step_record(warm, 1, outcome, 2.0))
    assert status.step == 0  # warm steps are not RL steps
    rec.finished("enough", None)
    assert status.phase == "failed" and status.last_error == "stopped by request: enough"
    assert (tmp_path / "summary.json").exists()


# -- step loop -----------------------------------------------------------------------------------


class FakeScheduler:
    def __init__(self, groups):
        self.groups = list(groups)
        self.dropped_stale = 1
        self.versions: list[int] = []
        self.targets: list[int] = []
        self.closed = False

    def start(self, version):
        self.versions.append(version)

    def begin_batch(self, target):
        self.targets.append(target)

    def set_version(self, version):
        self.versions.append(version)

    async def take(self):
        return self.groups.pop(0)

    def take_drops(self):
        return {}, []

    async def close(self):
        self.closed = True


class FakeEvaluator:
    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    async def after_rl_step(self, number, max_steps, line):
        self.calls.append(("rl", number))

    async def after_warmup_step(self, number, max_steps, line):
        self.calls.append(("warmup", number))
        return number == 2  # the dev reward reached the target


def make_loop(tmp_path, build, skips=()):
    progress = Progress()
    trainer = FakeTrainer()
    trainer.skip = list(skips)
    ctx = context()
    checkpointer = Checkpointer(trainer, ctx, progress, RunOutputs(tmp_path))
    evaluator = FakeEvaluator()
    scheduler = FakeScheduler(build.group([build.trace(f"t{i}", float(i % 2))]) for i in range(40))
    status = RunStatus()
    loop = StepLoop(
        trainer,
        progress,
        RolloutFilters(FiltersConfig(), 64),
        checkpointer,
        evaluator,
        recorder(status, RunOutputs(tmp_path), progress),
        lambda phase: scheduler,
        asyncio.Event(),
    )
    return loop, trainer, progress, scheduler, evaluator, status


async def test_step_loop_trains_a_phase_to_its_steps(tmp_path, build):
    loop, trainer, progress, scheduler, evaluator, status = make_loop(tmp_path, build)
    await loop.run(rl_phase(ORCH, {}, credit(), live=True, id_prefix="r"))
    assert [s["step"] for s in trainer.submitted] == [0, 1, 2]
    assert [s["state"].rl_steps for s in trainer.submitted] == [1, 2, 3]  # the state once trained
    assert progress.state.rl_steps == 3 and progress.trainer_step == 3 and status.step == 3
    assert evaluator.calls == [("rl", 1), ("rl", 2), ("rl", 3)]
    assert scheduler.closed and progress.groups_dropped_stale() == 1
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3


async def test_a_skipped_step_is_taken_again_and_too_many_fail(tmp_path, build):
    loop, trainer, progress, *_ = make_loop(tmp_path, build, skips=[True, False])
    await loop.run(rl_phase(ORCH, {}, credit(), live=True, id_prefix="r"))
    assert progress.state.rl_steps == 3 and len(trainer.submitted) == 4
    loop, trainer, progress, *_ = make_loop(tmp_path / "b", build, skips=[True] * MAX_SKIPS_IN_A_ROW)
    (tmp_path / "b").mkdir()
    with pytest.raises(RunFailed, match="skipped 3 steps in a row"):
        await loop.run(rl_phase(ORCH, {}, credit(), live=True, id_prefix="r"))


async def test_warmup_ends_when_its_dev_check_says_so(tmp_path, build):
    loop, trainer, progress, _, evaluator, _ = make_loop(tmp_path, build)
    orch = ORCH.model_copy(
        update={"warm_start": ORCH.warm_start.model_copy(update={"max_steps": 10, "batch_size": 2})}
    )
    await loop.run(warmup_phase(orch, {}, credit(), live=False, id_prefix="w"))
    assert progress.state.warmup_steps == 2 and evaluator.calls == [("warmup", 1), ("warmup", 2)]
    assert progress.state.rl_steps == 0 and trainer.submitted[0]["metrics"]["off_policy_lag"] == 0.0
