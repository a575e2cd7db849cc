"""Hostile and careless RunGroup requests against a real env-server (`rlrun serve env-server`
as a subprocess), watched from outside as an operator would (tests/support/proc_watch.py):
its process tree's memory and CPU time from /proc, and a health probe loop with a kubelet's
probe timeout during every call.

- A group larger than `limits.max_group_size` is refused before anything starts:
  INVALID_ARGUMENT naming `n` and the limit, no memory taken, health answering throughout.
- A group within the limit whose caller's deadline passes is stopped: the server's work ends
  within the deadline plus a bounded grace (the pool's ABANDON_GRACE_S, after which a worker
  that did not stop is killed), and its memory comes back to within a small margin of the
  level before the call.

The rollouts play a rule target (the env's reference answer), so no inference service is
needed and every rollout is the env-server's own work.
"""

from __future__ import annotations

import time

import grpc
import pytest
from env_test_servers import serve_builtin
from proc_watch import HealthProbe, TreeSampler, sample_tree

from rlrun.env_server.server.pool import ABANDON_GRACE_S
from rlrun.v1 import env_pb2, plan_pb2

LIMIT = 400_000
"""This server's limits.max_group_size: the issue's n = 300,000 fits, 10^6 and 2^31 - 1 do not."""
MB = 2**20
RSS_MARGIN_MB = 64
"""How far above its level before a call the server's memory may stay once the call is over
(the allocator keeps some pages; the issue saw 4 GB stay)."""
QUIET_WINDOW_S = 1.0
"""The server's work counts as stopped once the processes that were there when the call began
used next to no CPU for this long (a replacement worker's start is not the call's work)."""
PROBE_FAILURES = 3
"""Consecutive failed probes after which a kubelet restarts the container (its default
failureThreshold); the probes themselves time out after 1 s, a kubelet's default."""

ENVS = """
[[orchestrator.train.env]]
id = "reverse-text"
pool = { type = "static", num_workers = 1 }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = serve_builtin(tmp_path_factory.mktemp("bounded"), ENVS, f"[limits]\nmax_group_size = {LIMIT}")
    yield server
    server.stop()


def group(n: int, group_id: str) -> env_pb2.RunGroupRequest:
    target = plan_pb2.PlanTarget(
        member_id="oracle",
        role=plan_pb2.MEMBER_ROLE_TRAIN,
        model=plan_pb2.ModelEndpoint(name="oracle", kind=plan_pb2.ENDPOINT_KIND_RULE),
        sampling={"temperature": 1.0, "max_tokens": 12},
    )
    return env_pb2.RunGroupRequest(
        group_id=group_id,
        task={"env": "reverse-text", "split": "train", "idx": 0},
        plan=plan_pb2.GenerationPlan(targets=[target]),
        n=n,
    )


def settled_rss(pid: int, seconds: float = 2.0) -> int:
    """The tree's memory once it has been idle a moment (the smallest of a few readings)."""
    readings = []
    for _ in range(int(seconds / 0.2)):
        readings.append(sample_tree(pid).rss)
        time.sleep(0.2)
    return min(readings)


def warm_up(server) -> None:
    """A small group first, so that the worker is up and its imports are paid for."""
    reply = server.stub.RunGroup(group(8, "warm-up"), timeout=120)
    assert len(reply.traces) == 8 and not [e for t in reply.traces for e in t.errors]


@pytest.mark.parametrize("n", [2**31 - 1, 1_000_000])
def test_a_group_over_the_limit_is_refused_at_once_naming_the_field(server, n):
    warm_up(server)
    pid = server.process.pid
    before = settled_rss(pid)
    with HealthProbe(server.address) as probe, TreeSampler(pid) as sampler:
        time.sleep(0.5)  # probes before the call too
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.RunGroup(group(n, f"huge-{n}"), timeout=60)
        took = time.monotonic() - started
        time.sleep(1.0)
    print(f"n={n}: {caught.value.code().name} after {took:.3f} s; peak RSS {sampler.peak_rss() / MB:.1f} MB")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (f"n: {n} rollouts exceed the limit limits.max_group_size = {LIMIT}")
    assert probe.probes >= 4 and probe.failures_in_a_row < PROBE_FAILURES, probe.failures
    assert (sampler.peak_rss() - before) / MB < RSS_MARGIN_MB


@pytest.mark.slow  # about 35 s
def test_a_group_past_its_deadline_stops_and_gives_its_memory_back(server):
    """The issue's n = 300,000 with a 10 s deadline: the call ends DEADLINE_EXCEEDED, and the
    server's work stops within the grace, not 45 s later."""
    warm_up(server)
    pid = server.process.pid
    before = settled_rss(pid)
    deadline_s = 10.0
    with HealthProbe(server.address) as probe, TreeSampler(pid) as sampler:
        time.sleep(0.5)
        started = time.monotonic()
        pids = frozenset(sampler.samples[-1].cpu_s)
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.RunGroup(group(300_000, "past-deadline"), timeout=deadline_s)
        ended = time.monotonic()
        stopped = sampler.wait_quiet(ended, ABANDON_GRACE_S + 60, window_s=QUIET_WINDOW_S, pids=pids)
        peak = sampler.peak_rss(started)
        during = [s for s in sampler.samples if started <= s.at <= ended]
        busy = during[0].busy_cores(during[-1])
        warm_up(server)  # a replacement worker (if the first was killed) is up before memory is read
    after = settled_rss(pid)
    print(
        f"{caught.value.code().name} after {ended - started:.2f} s; work stopped {stopped - ended:.2f} s "
        f"after the call ended; RSS before {before / MB:.1f} MB, peak {peak / MB:.1f} MB, after "
        f"{after / MB:.1f} MB; {busy:.2f} cores on average; health: {probe.probes} probes, slowest "
        f"{probe.slowest_s:.3f} s, failures {probe.failures}; {len(pids)} processes"
    )
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The call did start real work (otherwise stopping it would prove nothing) ...
    assert (peak - before) / MB > RSS_MARGIN_MB
    assert busy > 0
    # ... which ended within the grace: the worker stops the abandoned job, or is killed once
    # ABANDON_GRACE_S has passed (here it is: 300,000 episodes are built and started in code
    # that does not await). The last busy window ends up to a window past the last work,
    # and the server notices the deadline up to a window after the client does.
    assert stopped - ended <= ABANDON_GRACE_S + 2 * QUIET_WINDOW_S
    # ... and left no memory behind.
    assert (after - before) / MB < RSS_MARGIN_MB
    assert probe.failures_in_a_row < PROBE_FAILURES, probe.failures
