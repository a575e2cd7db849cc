"""The run: connect, resume, warm start, RL, finish.

A run always resumes from the trainer's newest checkpoint that its own records reach (step 0,
saved by a fresh trainer, for a new run): the orchestrator's state travels in the checkpoint
with the weights (each SubmitBatch carries the state as it will be once the batch trained),
so the pair always belongs to one step. When the trainer is lost mid-run (it died, or came
back at an older step), the run goes back to that checkpoint and carries on; steps after it
are trained again, and their metrics lines replaced.

The parts, each built once the services answered:
- `RunContext` (context.py): what is fixed for the run: plans, credit pipelines, sampler,
  filters and every phase's targets;
- `Progress` (progress.py): the one owner of the trainer step, the policy version and the
  orchestrator state;
- `StepLoop` (loop.py): a phase's steps, the same for the warm start and RL (phase.py);
- `Evaluator` (evaluator.py), `Checkpointer` (checkpointer.py), `Recorder` (recorder.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rlrun.common.config import ConfigError, RunConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.collect.scheduler import AllGroupsStale, GroupScheduler, GroupsFailing
from rlrun.orchestrator.run.checkpointer import Checkpointer
from rlrun.orchestrator.run.connections import Connections, service_addresses, wait_ready
from rlrun.orchestrator.run.context import RunContext, model_vocab_size
from rlrun.orchestrator.run.evaluator import Evaluator
from rlrun.orchestrator.run.loop import MAX_BATCH_ATTEMPTS, MAX_SKIPS_IN_A_ROW, StepLoop
from rlrun.orchestrator.run.outputs import RunOutputs
from rlrun.orchestrator.run.phase import Phase, rl_phase, warmup_phase
from rlrun.orchestrator.run.plan import samples_live_policy
from rlrun.orchestrator.run.progress import Progress
from rlrun.orchestrator.run.recorder import Recorder
from rlrun.orchestrator.run.replicas import LiveReplicas
from rlrun.orchestrator.run.step import RunFailed, RunStopped
from rlrun.orchestrator.run.traces import TokenTexts, TraceWriter
from rlrun.orchestrator.run.trainer_client import TrainerLost

__all__ = [
    "MAX_BATCH_ATTEMPTS",
    "MAX_SKIPS_IN_A_ROW",
    "Run",
    "RunFailed",
    "RunStopped",
    "describe_error",
    "model_vocab_size",
]

log = logging.getLogger(__name__)


def describe_error(error: BaseException) -> str:
    """A one-line reason: the first leaf of an exception group, gRPC errors without their debug dump."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    if isinstance(error, grpc.aio.AioRpcError):
        return f"gRPC {error.code().name}: {error.details()}"
    if isinstance(error, RunFailed | ConfigError):
        return str(error)
    return f"{type(error).__name__}: {error}"


EXPECTED_ERRORS = (RunFailed, ConfigError, TimeoutError, GroupsFailing, AllGroupsStale)
"""Failures reported by their message alone (no traceback)."""


@dataclass(frozen=True)
class RunParts:
    """Everything the run drives, built once its services answered."""

    context: RunContext
    checkpointer: Checkpointer
    evaluator: Evaluator
    loop: StepLoop


class Run:
    def __init__(
        self,
        config: RunConfig,
        status: RunStatus,
        options: ClientOptions | None = None,
        addresses: Callable[[], list[str]] | None = None,
    ):
        """`addresses`: reads the live policy's replica addresses again (from the run file),
        followed every `orchestrator.replica_refresh_s`; None keeps the config's."""
        self.config = config
        self.orch = config.orchestrator
        self.status = status
        self.status.max_steps = self.orch.max_steps
        self.options = options or ClientOptions.from_config(config.grpc)
        self.outputs = RunOutputs(config.run_dir)
        self.progress = Progress()
        self.replicas = LiveReplicas(config.inference.addresses)
        self.read_addresses = addresses
        self.token_texts = TokenTexts(self.replicas.addresses, self.options)
        self.recorder = Recorder(
            self.orch,
            status,
            self.outputs,
            self.progress,
            TraceWriter(self.orch.traces, self.outputs, self.token_texts),
        )
        self.connections: Connections | None = None
        self.parts: RunParts | None = None
        self.stop_reason: str | None = None
        self._stop = asyncio.Event()
        self.resumes = 0
        """Times this process went back to a checkpoint after losing the trainer."""
        self._nonce = secrets.token_hex(3)  # group ids stay unique across restarts of this process

    def request_stop(self, reason: str) -> None:
        if self.status.finished or self.stop_reason is not None:
            return
        log.info("stop requested: %s", reason)
        self.stop_reason = reason
        self.status.phase = "stopping"
        self._stop.set()

    async def execute(self) -> None:
        """Runs to the end; the outcome is in `status` (never raises except on cancellation)."""
        following = None
        if self.read_addresses is not None:
            following = asyncio.create_task(
                self.replicas.follow(self.read_addresses, self.orch.replica_refresh_s), name="follow-replicas"
            )
        try:
            parts = self.parts = await self._start()
            while True:
                await self._resume(parts)
                try:
                    await self._phases(parts)
                    break
                except TrainerLost as lost:
                    self.resumes += 1
                    log.warning("lost the trainer (%s); resuming from its checkpoint", lost)
            self.recorder.finished(self.stop_reason, parts.evaluator.last)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            last = self.parts.evaluator.last if self.parts is not None else None
            self.recorder.failed(describe_error(error), error, isinstance(error, EXPECTED_ERRORS), last)
        finally:
            if following is not None:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
            await self.token_texts.close()
            if self.connections is not None:
                await self.connections.close()

    async def _start(self) -> RunParts:
        addresses = service_addresses(self.config)
        log.info(
            "waiting for %d services: %s", len(addresses), ", ".join(f"{k}={v}" for k, v in addresses.items())
        )
        await wait_ready(addresses, self.options, self.orch.startup_timeout_s)
        connections = self.connections = Connections(self.config, self.options)
        context = RunContext.build(
            self.config, connections, await connections.describe_envs(), self.status, self.replicas
        )
        checkpointer = Checkpointer(connections.trainer, context, self.progress, self.outputs)
        evaluator = Evaluator(self.orch, context, self.progress, self.outputs, self.status, self._nonce)

        def new_scheduler(phase: Phase) -> GroupScheduler:
            return GroupScheduler(phase.settings, phase.targets, context.sampler)

        loop = StepLoop(
            connections.trainer,
            self.progress,
            context.filters,
            checkpointer,
            evaluator,
            self.recorder,
            new_scheduler,
            self._stop,
        )
        return RunParts(context, checkpointer, evaluator, loop)

    async def _resume(self, parts: RunParts) -> None:
        back = await parts.checkpointer.resume()
        parts.evaluator.restarted()
        self.recorder.resumed(self.progress.state, back.checkpoint, self.resumes)

    async def _phases(self, parts: RunParts) -> None:
        context, state = parts.context, self.progress.state
        if context.has_warmup and not state.warmup_done:
            if self.stop_reason is None:
                self.status.phase = "warmup"
            await parts.loop.run(self._warmup(context))
            if self.stop_reason is None:
                state.warmup_done = True
                await parts.checkpointer.save()  # a resume must not take the warm start up again
        if self.stop_reason is None:
            self.status.phase = "running"
            await parts.evaluator.before_rl()
            await parts.loop.run(self._rl(context))
            if self.progress.state.rl_steps >= self.orch.max_steps and self.stop_reason is None:
                await parts.evaluator.after_rl()
        if parts.checkpointer.behind:
            await parts.checkpointer.save()

    def _id_prefix(self, phase: str) -> str:
        return f"{phase}-{self._nonce}-t{self.progress.trainer_step}"

    def _warmup(self, context: RunContext) -> Phase:
        assert context.warm_credit is not None
        live = samples_live_policy(next(iter(context.plans.warmup.values())))
        return warmup_phase(
            self.orch, context.warmup_targets, context.warm_credit, live, self._id_prefix("warmup")
        )

    def _rl(self, context: RunContext) -> Phase:
        live = samples_live_policy(next(iter(context.plans.train.values())))
        return rl_phase(self.orch, context.train_targets, context.credit, live, self._id_prefix("rl"))
