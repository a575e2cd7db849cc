"""The asyncio scheduler of training groups: it samples tasks, dispatches groups to the
env-servers, and hands finished groups to the run loop, enforcing bounded staleness.

The run loop tells it the trainer's current version (`set_version`) and, for each batch it
starts collecting, the version that batch will train at (`begin_batch`). From these the
scheduler keeps just enough groups in flight (see staleness.py), drops finished groups that are
too old, and cancels in-flight groups that can no longer be fresh (locally and through the
env-server's Cancel). Dropped groups are dropped whole and counted. Failed groups (see
retry.py) are dropped too; only a sustained failure rate of one env ends the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from rlrun.common.config.orchestrator import GroupFailuresConfig
from rlrun.common.wire.trace import TaskRef, Trace
from rlrun.orchestrator import metrics
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.collect.retry import FailureRate
from rlrun.orchestrator.collect.rollouts import EnvRollouts, GroupFailure, run_group
from rlrun.orchestrator.collect.sampler import TaskSampler
from rlrun.orchestrator.collect.staleness import groups_to_dispatch, is_stale

log = logging.getLogger(__name__)


DROPS_KEPT = 64
"""Dropped groups kept between two take_drops calls (their counts are all kept)."""


class AllGroupsStale(RuntimeError):
    """Nothing but stale groups for a long stretch: the replicas are not getting new weights."""


class GroupsFailing(RuntimeError):
    """One env failed a sustained share of its recent groups (orchestrator.group_failures)."""


@dataclass(frozen=True)
class SchedulerSettings:
    batch_size: int
    group_size: int
    max_off_policy_steps: int
    enforce_staleness: bool
    """False when the trained rollouts do not come from the live policy (an oracle, a teacher)."""
    inflight_limit: int
    max_retries: int
    timeout_s: float
    group_failures: GroupFailuresConfig
    id_prefix: str
    """Group ids are `<id_prefix>-<counter>`, unique within the run."""


STALE = "stale"
"""The reason of a group dropped for staleness (a failed group's is its failure's label)."""


@dataclass(frozen=True)
class DroppedGroup:
    """A group that will never train, and why (for the dashboard's trace files)."""

    group_id: str
    env: str
    task: TaskRef
    reason: str
    """`stale`, or the failure's label (`internal`, `trace_errors`, ...)."""
    detail: str
    traces: list[Trace] = field(default_factory=list)
    """Its traces where it finished (a stale group cancelled in flight, or a failed one, has none)."""


@dataclass
class _Inflight:
    task: asyncio.Task
    env: str
    dispatch_version: int
    ref: TaskRef


class GroupScheduler:
    def __init__(self, settings: SchedulerSettings, targets: dict[str, EnvRollouts], sampler: TaskSampler):
        self.settings = settings
        self.targets = targets
        self.sampler = sampler
        self._ready: deque[RolloutGroup] = deque()
        self._inflight: dict[str, _Inflight] = {}
        self._cancels: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._fatal: BaseException | None = None
        self._producer: asyncio.Task | None = None
        self._current = 0
        self._target = 0
        self._taken = 0
        self._counter = 0
        self._stale_in_a_row = 0
        self._failures = FailureRate(settings.group_failures.window, settings.group_failures.max_ratio)
        self.dropped_stale = 0
        self._drops: deque[DroppedGroup] = deque(maxlen=DROPS_KEPT)
        self._drop_counts: dict[str, int] = {}

    # -- driven by the run loop ----------------------------------------------------------------

    def start(self, current_version: int) -> None:
        self._current = self._target = current_version
        self._producer = asyncio.create_task(self._produce(), name=f"{self.settings.id_prefix}-producer")

    def set_version(self, version: int) -> None:
        """The trainer finished a step: new groups are generated under `version`."""
        self._current = version
        self._wake.set()

    def begin_batch(self, target_version: int) -> None:
        """A new batch is being collected; it will train at `target_version`."""
        self._target = target_version
        self._taken = 0
        self._drop_stale()
        self._wake.set()

    async def take(self) -> RolloutGroup:
        """The next finished group that is fresh enough for the current batch."""
        while True:
            if self._fatal is not None:
                raise self._fatal
            while self._ready:
                group = self._ready.popleft()
                metrics.QUEUE_DEPTH.set(len(self._ready))
                if self._stale(group.policy_start):
                    self._count_stale_group(group)
                    continue
                self._taken += 1
                self._stale_in_a_row = 0
                self._wake.set()
                return group
            self._arrived.clear()
            await self._arrived.wait()

    async def close(self) -> None:
        """Cancels the producer and everything in flight (also on the env-servers)."""
        if self._producer is not None:
            self._producer.cancel()
        by_env: dict[str, list[str]] = {}
        for group_id, inflight in self._inflight.items():
            inflight.task.cancel()
            by_env.setdefault(inflight.env, []).append(group_id)
        for env, ids in by_env.items():
            self._cancel_remote(env, ids)
        pending = [i.task for i in self._inflight.values()] + ([self._producer] if self._producer else [])
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*self._cancels, return_exceptions=True)
        self._ready.clear()
        metrics.QUEUE_DEPTH.set(0)
        metrics.INFLIGHT.set(0)

    def take_drops(self) -> tuple[dict[str, int], list[DroppedGroup]]:
        """The groups dropped since the last call: how many for each reason, and the last
        DROPS_KEPT of them."""
        counts, drops = self._drop_counts, list(self._drops)
        self._drop_counts = {}
        self._drops.clear()
        return counts, drops

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def groups_dispatched(self) -> int:
        return self._counter

    # -- internals -----------------------------------------------------------------------------

    @property
    def _patience(self) -> int:
        """Stale drops in a row after which the run fails instead of spinning."""
        return max(4 * self.settings.batch_size, 64)

    def _stale(self, policy_start: int) -> bool:
        s = self.settings
        return s.enforce_staleness and is_stale(policy_start, self._target, s.max_off_policy_steps)

    def _record_drop(self, drop: DroppedGroup) -> None:
        self._drop_counts[drop.reason] = self._drop_counts.get(drop.reason, 0) + 1
        self._drops.append(drop)

    def _count_stale_group(self, group: RolloutGroup) -> None:
        """A finished group too old for the batch."""
        why = f"rollouts from version {group.policy_start}"
        self._count_stale(group.env, group.task, group.group_id, why, group.traces)

    def _count_stale(
        self, env: str, task: TaskRef, group_id: str, why: str, traces: list[Trace] | None = None
    ) -> None:
        self.dropped_stale += 1
        self._stale_in_a_row += 1
        metrics.GROUPS_DROPPED_STALE.labels(env=env).inc()
        failures = self.targets[env].failures
        if failures is not None:
            failures.group_stale(env)
        detail = (
            f"{why}, batch trains at version {self._target} "
            f"(max_off_policy_steps {self.settings.max_off_policy_steps})"
        )
        self._record_drop(DroppedGroup(group_id, env, task, STALE, detail, list(traces or [])))
        log.info("group %s dropped as stale: %s", group_id, detail)
        if self._stale_in_a_row >= self._patience and self._fatal is None:
            self._fatal = AllGroupsStale(
                f"{self._stale_in_a_row} groups in a row were too stale to train (the last: {why}, while the "
                f"trainer is at version {self._current}); are the inference replicas receiving new weights?"
            )
            self._arrived.set()

    def _drop_stale(self) -> None:
        if not self.settings.enforce_staleness:
            return
        fresh = deque()
        for group in self._ready:
            if self._stale(group.policy_start):
                self._count_stale_group(group)
            else:
                fresh.append(group)
        self._ready = fresh
        metrics.QUEUE_DEPTH.set(len(self._ready))
        doomed: dict[str, list[str]] = {}
        for group_id, inflight in list(self._inflight.items()):
            if self._stale(inflight.dispatch_version):
                inflight.task.cancel()
                del self._inflight[group_id]
                doomed.setdefault(inflight.env, []).append(group_id)
                self._count_stale(
                    inflight.env,
                    inflight.ref,
                    group_id,
                    f"in flight since version {inflight.dispatch_version}",
                )
        for env, ids in doomed.items():
            self._cancel_remote(env, ids)
        metrics.INFLIGHT.set(len(self._inflight))

    def _cancel_remote(self, env: str, group_ids: list[str]) -> None:
        async def cancel() -> None:
            try:
                await self.targets[env].client.cancel(group_ids)
            except Exception as error:  # best effort: the local call is cancelled either way
                log.warning("Cancel(%s) on env %s failed: %s", group_ids, env, error)

        task = asyncio.create_task(cancel())
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _produce(self) -> None:
        try:
            await self._dispatch_forever()
        except Exception as error:  # the run loop waits on take(): hand it the error
            self._fatal = error
            self._arrived.set()
            raise

    async def _dispatch_forever(self) -> None:
        s = self.settings
        while True:
            self._wake.clear()
            count = groups_to_dispatch(
                current_version=self._current,
                target_version=self._target,
                max_off_policy_steps=s.max_off_policy_steps,
                batch_size=s.batch_size,
                taken=self._taken,
                pending=len(self._ready) + len(self._inflight),
                inflight=len(self._inflight),
                inflight_limit=s.inflight_limit,
            )
            for _ in range(count):
                self._dispatch()
            await self._wake.wait()

    def _dispatch(self) -> None:
        env, idx = self.sampler.sample()
        group_id = f"{self.settings.id_prefix}-{self._counter:06d}"
        self._counter += 1
        ref = TaskRef(env=env, split="train", idx=idx)
        task = asyncio.create_task(self._run(group_id, env, ref))
        self._inflight[group_id] = _Inflight(task, env, self._current, ref)
        metrics.INFLIGHT.set(len(self._inflight))

    def _attempt_version(self, group_id: str) -> int:
        """A (re)try of an in-flight group generates under the current version from now on."""
        self._inflight[group_id].dispatch_version = self._current
        return self._current

    async def _run(self, group_id: str, env: str, task: TaskRef) -> None:
        s = self.settings
        try:
            result = await run_group(
                self.targets[env],
                group_id,
                task,
                s.group_size,
                version=lambda: self._attempt_version(group_id),
                max_retries=s.max_retries,
                timeout_s=s.timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.error("group %s on env %s failed: %s", group_id, env, error)
            if self._fatal is None:
                self._fatal = error
        else:
            if isinstance(result, GroupFailure):
                self._record_drop(DroppedGroup(group_id, env, task, result.label, result.reason))
                if self._failures.record(env, failed=True) and self._fatal is None:
                    self._fatal = GroupsFailing(
                        f"{self._failures.describe(env)}; the last, {group_id}, after {result.attempts} "
                        f"attempt(s): {result.reason}"
                    )
            else:
                self._failures.record(env, failed=False)
                self._ready.append(result)
                metrics.QUEUE_DEPTH.set(len(self._ready))
        finally:
            self._inflight.pop(group_id, None)
            metrics.INFLIGHT.set(len(self._inflight))
            self._arrived.set()
            self._wake.set()
