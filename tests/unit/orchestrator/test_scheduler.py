"""The group scheduler against a fake env client: dispatch within the staleness bound, stale
drops, failure rates, and cancellation on close."""

from __future__ import annotations

import asyncio

import pytest

from rlrun.common.config.orchestrator import GroupFailuresConfig
from rlrun.common.wire.orchestrator import RunStatus, status_from_proto, status_to_proto
from rlrun.orchestrator.collect.rollouts import EnvRollouts
from rlrun.orchestrator.collect.sampler import EnvTasks, TaskSampler
from rlrun.orchestrator.collect.scheduler import GroupScheduler, GroupsFailing, SchedulerSettings
from rlrun.v1 import plan_pb2


class FakeEnv:
    """RunGroup answers when released (or at once with `instant`); Cancel is recorded."""

    address = "fake:0"

    def __init__(self, build, instant=True, errors=()):
        self.build = build
        self.instant = instant
        self.errors = errors
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.version = 0
        """The policy version the fake replicas serve (the traces' policy span)."""

    async def run_group(self, group_id, task, plan, n, timeout_s):
        self.calls.append(group_id)
        if not self.instant:
            await self.release.wait()
        return [
            self.build.trace(f"{group_id}-{i}", 1.0, errors=self.errors, span=(self.version, self.version))
            for i in range(n)
        ]

    async def cancel(self, group_ids):
        self.cancelled.extend(group_ids)


def scheduler(env, *, batch_size=2, max_off=1, enforce=True, failures=None, status=None) -> GroupScheduler:
    settings = SchedulerSettings(
        batch_size=batch_size,
        group_size=2,
        max_off_policy_steps=max_off,
        enforce_staleness=enforce,
        inflight_limit=8,
        max_retries=0,
        timeout_s=5,
        group_failures=failures or GroupFailuresConfig(),
        id_prefix="rl-x",
    )
    targets = {
        "rev": EnvRollouts(
            env="rev",
            client=env,
            plan=plan_pb2.GenerationPlan(),
            trained_members=frozenset({"policy"}),
            temperatures={"policy": 1.0},
            failures=status,
        )
    }
    return GroupScheduler(settings, targets, TaskSampler([EnvTasks("rev", 1.0, 50, 0)], seed=0))


async def test_groups_arrive_with_their_ids_and_version(build):
    env = FakeEnv(build)
    s = scheduler(env)
    s.start(0)
    s.begin_batch(0)
    try:
        groups = [await asyncio.wait_for(s.take(), 5) for _ in range(2)]
    finally:
        await s.close()
    assert [g.group_id for g in groups] == ["rl-x-000000", "rl-x-000001"]
    assert all(g.dispatch_version == 0 and len(g.traces) == 2 for g in groups)
    assert s.groups_dispatched <= 8  # never more than the in-flight limit


async def test_dispatch_stays_within_the_staleness_bound(build):
    env = FakeEnv(build, instant=False)
    s = scheduler(env, batch_size=2, max_off=1)
    s.start(0)
    s.begin_batch(0)
    await asyncio.sleep(0.05)
    # batches for versions 0 and 1 may be in flight; nothing more can be fresh
    assert s.inflight == 4
    env.release.set()
    await s.close()


async def test_ready_groups_too_old_for_the_batch_are_dropped_and_counted(build):
    env = FakeEnv(build)
    s = scheduler(env, batch_size=2, max_off=1)
    s.start(0)
    s.begin_batch(0)
    await asyncio.sleep(0.05)
    assert s.ready >= 2
    env.version = 5
    s.set_version(5)
    s.begin_batch(5)  # version-0 groups are 5 versions behind: stale
    try:
        group = await asyncio.wait_for(s.take(), 5)
    finally:
        await s.close()
    assert s.dropped_stale >= 2 and group.dispatch_version == 5 and group.policy_start == 5
    counts, drops = s.take_drops()
    assert counts == {"stale": s.dropped_stale} and len(drops) == s.dropped_stale
    finished = [d for d in drops if d.traces]  # the ready ones come with their traces
    assert finished and all(len(d.traces) == 2 and d.reason == "stale" for d in finished)
    assert "rollouts from version 0, batch trains at version 5" in finished[0].detail
    assert s.take_drops() == ({}, [])  # each drop is handed out once


async def test_no_stale_drops_when_staleness_is_not_enforced(build):
    env = FakeEnv(build)
    s = scheduler(env, enforce=False)
    s.start(0)
    s.begin_batch(0)
    await asyncio.sleep(0.05)
    s.set_version(5)
    s.begin_batch(5)
    try:
        group = await asyncio.wait_for(s.take(), 5)
    finally:
        await s.close()
    assert s.dropped_stale == 0 and group.dispatch_version == 0


async def test_a_sustained_failure_rate_ends_the_phase(build):
    env = FakeEnv(build, errors=[("HarnessError", "boom", False)])
    s = scheduler(env, failures=GroupFailuresConfig(window=4, max_ratio=0.5))
    s.start(0)
    s.begin_batch(0)
    try:
        with pytest.raises(GroupsFailing, match="rl-x-"):
            await asyncio.wait_for(s.take(), 5)
    finally:
        await s.close()
    counts, drops = s.take_drops()
    assert counts == {"non_retryable_trace_errors": len(drops)} and len(drops) >= 2
    assert all("HarnessError: boom" in d.detail and not d.traces for d in drops)


async def test_the_status_hears_the_first_failed_rollout_and_counts_dropped_groups(build):
    """What `rlrun local` shows at once: the first failure with its env, task and error (each
    distinct error once, with its count), then running counts of failed and stale groups."""
    status = RunStatus()
    env = FakeEnv(build, errors=[("HarnessError", "TypeError: the reward is not async", False)])
    s = scheduler(env, failures=GroupFailuresConfig(window=4, max_ratio=0.5), status=status)
    s.start(0)
    s.begin_batch(0)
    try:
        with pytest.raises(GroupsFailing):
            await asyncio.wait_for(s.take(), 5)
    finally:
        await s.close()
    assert status.first_rollout_error.startswith("env 'rev', train task ")
    assert status.first_rollout_error.endswith(
        ": trace errors: HarnessError: TypeError: the reward is not async (2 rollouts)"
    )
    assert status.groups_failed >= 2
    assert status_from_proto(status_to_proto(status)) == status

    stale = RunStatus()
    fresh = FakeEnv(build)
    s = scheduler(fresh, status=stale)
    s.start(0)
    s.begin_batch(0)
    await asyncio.sleep(0.05)
    fresh.version = 5
    s.set_version(5)
    s.begin_batch(5)
    try:
        await asyncio.wait_for(s.take(), 5)
    finally:
        await s.close()
    assert stale.groups_dropped_stale == s.dropped_stale >= 2 and stale.groups_failed == 0


async def test_close_cancels_in_flight_groups_on_the_env_server(build):
    env = FakeEnv(build, instant=False)
    s = scheduler(env)
    s.start(0)
    s.begin_batch(0)
    await asyncio.sleep(0.05)
    inflight = set(env.calls)
    await s.close()
    await asyncio.sleep(0)
    assert inflight and set(env.cancelled) == inflight
