"""What the trainer service does, without gRPC: one batch at a time, train on every rank, then
push the new weights to every replica, then checkpoint on the configured interval.

Training and state gathering run in a worker thread (torch releases the GIL), so the event
loop keeps answering health checks and GetStatus while a batch trains.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.common.config.trainer import CheckpointConfig
from rlrun.common.types import TrainingBatch
from rlrun.trainer import metrics
from rlrun.trainer.broadcast import ReplicaResult, WeightBroadcaster
from rlrun.trainer.checkpoint import save_checkpoint
from rlrun.trainer.coordinator import Coordinator
from rlrun.trainer.learner import StepResult

log = logging.getLogger("rlrun.trainer.runtime")


class StepMismatch(Exception):
    """A batch for another step than the trainer's next one."""

    def __init__(self, expected: int, got: int):
        super().__init__(f"batch.step: the trainer expects step {expected}, got {got}")
        self.expected = expected
        self.got = got


@dataclass
class SubmitOutcome:
    result: StepResult
    broadcasts: list[ReplicaResult] = field(default_factory=list)


class TrainerRuntime:
    def __init__(
        self,
        coordinator: Coordinator,
        broadcaster: WeightBroadcaster,
        has_replicas: bool,
        checkpoint_dir: Path,
        checkpoint: CheckpointConfig,
        arch: dict,
        world_size: int,
        resume_state: bytes = b"",
        last_checkpoint: str = "",
    ):
        self.coordinator = coordinator
        self.broadcaster = broadcaster
        self.has_replicas = has_replicas
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint = checkpoint
        self.arch = arch
        self.world_size = world_size
        self.resume_state = resume_state
        self.last_checkpoint = last_checkpoint
        self.last_metrics: dict[str, float] = {}
        self.lock = asyncio.Lock()

    @property
    def step(self) -> int:
        return self.coordinator.learner.step

    @property
    def version(self) -> int:
        return self.coordinator.learner.version

    async def submit(self, batch: TrainingBatch) -> SubmitOutcome:
        """Trains a validated batch. Raises StepMismatch (nothing trained) for the wrong step."""
        async with self.lock:
            if batch.step != self.step:
                raise StepMismatch(self.step, batch.step)
            result = await asyncio.to_thread(self.coordinator.train, batch)
            metrics.record_step(result)
            outcome = SubmitOutcome(result)
            if result.skipped:
                log.warning("step %d skipped: %s", batch.step, result.skip_reason)
            else:
                outcome.broadcasts, result.metrics["broadcast_seconds"] = await self._broadcast()
                if self.checkpoint.interval and result.step % self.checkpoint.interval == 0:
                    await self._save(b"")
            self.last_metrics = dict(result.metrics)
            return outcome

    async def _broadcast(self) -> tuple[list[ReplicaResult], float]:
        if not self.has_replicas:
            return [], 0.0
        started = time.perf_counter()
        tensors = await asyncio.to_thread(self.coordinator.gather_weights, self.broadcaster.tensors_on_cpu)
        results = await self.broadcaster.broadcast(tensors, self.version)
        seconds = time.perf_counter() - started
        metrics.record_broadcast(results, seconds)
        failed = [r.address for r in results if not r.ok]
        log.info(
            "version %d broadcast to %d of %d replicas in %.3fs%s",
            self.version,
            len(results) - len(failed),
            len(results),
            seconds,
            f" (failed: {', '.join(failed)})" if failed else "",
        )
        return results, seconds

    async def broadcast_current(self) -> list[ReplicaResult]:
        """Pushes the current weights (after a resume the replicas still hold version 0's)."""
        async with self.lock:
            results, _ = await self._broadcast()
            return results

    async def _save(self, extra_state: bytes) -> tuple[Path, int]:
        started = time.perf_counter()
        state = await asyncio.to_thread(self.coordinator.capture_state)
        path = await asyncio.to_thread(
            save_checkpoint,
            self.checkpoint_dir,
            state,
            extra_state,
            self.arch,
            self.world_size,
            self.checkpoint.keep,
        )
        metrics.CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        self.last_checkpoint = str(path)
        log.info("checkpoint of step %d saved to %s", state.step, path)
        return path, state.step

    async def save(self, extra_state: bytes) -> tuple[Path, int]:
        """Returns the checkpoint folder and the step it holds."""
        async with self.lock:
            return await self._save(extra_state)
