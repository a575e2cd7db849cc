"""What the trainer service does, without gRPC: one batch at a time, train on every rank, then
push the new weights to every replica, then checkpoint on the configured intervals; roll back
to a checkpoint on request; keep every replica on the live policy version.

Training and state gathering run in a worker thread (torch releases the GIL), so the event
loop keeps answering health checks and GetStatus while a batch trains. A checkpoint's state is
copied while training waits, and its files are written in the background while the next
batch trains; a save waits for the one before it, so at most one is being written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from rlrun.common.config.trainer import CheckpointConfig
from rlrun.common.weights.protocol import WeightBroadcaster
from rlrun.common.wire.trainer import BroadcastResult, Resumed, StepResult
from rlrun.common.wire.training import TrainingBatch
from rlrun.trainer import metrics
from rlrun.trainer.checkpoint import (
    discard_after,
    latest_checkpoint,
    read_extra_state,
    save_checkpoint,
    step_of,
)
from rlrun.trainer.coordinator import Coordinator
from rlrun.trainer.learner import LearnerState

log = logging.getLogger("rlrun.trainer.runtime")


class StepMismatch(Exception):
    """A batch for another step than the trainer's next one."""

    def __init__(self, expected: int, got: int):
        super().__init__(f"batch.step: the trainer expects step {expected}, got {got}")
        self.expected = expected
        self.got = got


class NoCheckpoint(Exception):
    """A rollback with no complete checkpoint to go back to."""


def _detached(state: LearnerState) -> LearnerState:
    """A copy that training cannot change while it is written (on CPU the captured tensors
    share storage with the live parameters and optimizer moments)."""
    clone = lambda value: value.detach().clone() if isinstance(value, torch.Tensor) else value  # noqa: E731
    return LearnerState(
        step=state.step,
        version=state.version,
        model={k: v.detach().clone() for k, v in state.model.items()},
        optimizer=tree_map(clone, state.optimizer),
        scheduler=state.scheduler,
        rng=state.rng,
    )


class TrainerRuntime:
    def __init__(
        self,
        coordinator: Coordinator,
        broadcaster: WeightBroadcaster,
        checkpoint_dir: Path,
        checkpoint: CheckpointConfig,
        arch: dict,
        world_size: int,
        resume_state: bytes = b"",
        last_checkpoint: str = "",
    ):
        self.coordinator = coordinator
        self.broadcaster = broadcaster
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint = checkpoint
        self.arch = arch
        self.world_size = world_size
        self.resume_state = resume_state
        """The orchestrator's state as of the trainer's current step: what a checkpoint taken
        now stores (the latest SubmitBatch's, or the loaded checkpoint's)."""
        self.last_checkpoint = last_checkpoint
        self.last_metrics: dict[str, float] = {}
        self.lock = asyncio.Lock()
        self.left_out: set[str] = set()
        """Replicas that failed a broadcast: skipped until the watcher finds them answering."""
        self._writing: asyncio.Task[Path] | None = None
        self._saved_at = time.monotonic()
        self._saved_step = self.step if last_checkpoint else -1

    @property
    def step(self) -> int:
        return self.coordinator.learner.step

    @property
    def version(self) -> int:
        return self.coordinator.learner.version

    async def submit(self, batch: TrainingBatch, orchestrator_state: bytes = b"") -> StepResult:
        """Trains a validated batch. Raises StepMismatch (nothing trained) for the wrong step."""
        async with self.lock:
            if batch.step != self.step:
                raise StepMismatch(self.step, batch.step)
            result = await asyncio.to_thread(self.coordinator.train, batch)
            metrics.record_step(result)
            if result.skipped:
                log.warning("step %d skipped: %s", batch.step, result.skip_reason)
            else:
                if orchestrator_state:
                    self.resume_state = orchestrator_state
                result.broadcasts, result.metrics["broadcast_seconds"] = await self._broadcast()
                if self._checkpoint_due(result.step):
                    await self._start_save()
            self.last_metrics = dict(result.metrics)
            return result

    def _checkpoint_due(self, step: int) -> bool:
        every, seconds = self.checkpoint.interval, self.checkpoint.interval_s
        return bool(every and step % every == 0) or bool(
            seconds and time.monotonic() - self._saved_at >= seconds
        )

    async def _broadcast(
        self, to: list[str] | None = None, rollback: bool = False
    ) -> tuple[list[BroadcastResult], float]:
        targets = [a for a in self.broadcaster.addresses if a not in self.left_out] if to is None else to
        if not targets:
            return [], 0.0
        started = time.perf_counter()
        tensors = await asyncio.to_thread(self.coordinator.gather_weights, self.broadcaster.tensors_on_cpu)
        results = await self.broadcaster.broadcast(tensors, self.version, targets, rollback)
        seconds = time.perf_counter() - started
        metrics.record_broadcast(results, seconds)
        failed = [r.address for r in results if not r.ok]
        for address in failed:
            if address not in self.left_out:
                log.warning(
                    "replica %s missed version %d; it is left out of the broadcasts until it answers "
                    "again, then it gets the current weights",
                    address,
                    self.version,
                )
            self.left_out.add(address)
        self.left_out -= {r.address for r in results if r.ok}
        log.info(
            "version %d broadcast to %d of %d replicas in %.3fs%s",
            self.version,
            len(results) - len(failed),
            len(results),
            seconds,
            f" (failed: {', '.join(failed)})" if failed else "",
        )
        return results, seconds

    async def set_replicas(self, addresses: list[str]) -> None:
        async with self.lock:  # never while a broadcast is on its way
            await self.broadcaster.set_addresses(addresses)
            self.left_out &= set(addresses)

    async def resync(self, lagging: list[str]) -> list[BroadcastResult]:
        """Pushes the current weights to the replicas `lagging` (restarted ones hold their
        initial weights; one that failed a broadcast holds an older version, or a newer one
        that a rollback left behind)."""
        async with self.lock:
            results, _ = await self._broadcast(lagging, rollback=True)
            for result in results:
                if result.ok:
                    log.info("replica %s re-synced to version %d", result.address, self.version)
            return results

    # -- checkpoints --------------------------------------------------------------------------------

    async def _start_save(self) -> asyncio.Task[Path]:
        """Copies the state now (training waits); writes it in the background. Lock held."""
        if self._writing is not None:
            await asyncio.shield(self._writing)  # one write at a time, in step order
        started = time.perf_counter()
        state = await asyncio.to_thread(self.coordinator.capture_state)
        if self.coordinator.learner.parallel.device.type == "cpu":
            # On an accelerator the capture already copied the state to host memory.
            state = _detached(state)
        extra, step = self.resume_state, state.step
        self._saved_at, self._saved_step = time.monotonic(), step

        async def write() -> Path:
            path = await asyncio.to_thread(
                save_checkpoint,
                self.checkpoint_dir,
                state,
                extra,
                self.arch,
                self.world_size,
                self.checkpoint.keep,
                self.coordinator.learner.adapter_config,
            )
            metrics.CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
            self.last_checkpoint = str(path)
            log.info("checkpoint of step %d saved to %s", step, path)
            return path

        self._writing = asyncio.create_task(write())
        return self._writing

    async def save(self, extra_state: bytes = b"", expected_step: int | None = None) -> tuple[Path, int]:
        """Saves now and returns the folder and its step once written. `extra_state`, when
        given, replaces the orchestrator state saved with it; `expected_step`, when given,
        must be the trainer's step (else StepMismatch, nothing saved)."""
        async with self.lock:
            if expected_step is not None and expected_step != self.step:
                raise StepMismatch(self.step, expected_step)
            if extra_state:
                self.resume_state = extra_state
            step = self.step
            path = await self._start_save()
        return await path, step

    async def save_unsaved(self) -> None:
        """Saves when steps were trained since the last checkpoint (on SIGTERM: a pod being
        moved keeps its work), and waits until it is written."""
        async with self.lock:
            if self.step != self._saved_step:
                await self._start_save()
        await self.flush()

    async def flush(self) -> None:
        """Waits for the checkpoint being written, if any (before the process exits)."""
        if self._writing is not None:
            await asyncio.shield(self._writing)

    async def rollback(self, max_step: int | None) -> Resumed:
        """Back to the newest complete checkpoint at or before `max_step` (None: the newest);
        later checkpoints are deleted, and the restored weights pushed to every replica."""
        async with self.lock:
            await self.flush()
            path = latest_checkpoint(self.checkpoint_dir, max_step)
            if path is None:
                raise NoCheckpoint(
                    f"no complete checkpoint at or before step {max_step} under {self.checkpoint_dir}"
                )
            extra = read_extra_state(path)
            loaded = ""
            if step_of(path) != self.step:
                await asyncio.to_thread(self.coordinator.restore, path)
                loaded = str(path)
                log.warning("rolled back to %s (step %d, version %d)", path, self.step, self.version)
            for gone in discard_after(self.checkpoint_dir, self.step):
                log.info("deleted %s: its steps will be trained again", gone)
            self.resume_state, self.last_checkpoint = extra, str(path)
            self._saved_at, self._saved_step = time.monotonic(), self.step
            # Also when nothing was loaded: a trainer that restarted from this checkpoint left
            # the replicas on the newer versions of its lost steps.
            self.left_out.clear()
            await self._broadcast(rollback=True)
            return Resumed(self.step, self.version, loaded, extra)
