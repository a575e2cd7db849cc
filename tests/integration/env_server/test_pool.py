"""Worker pools with real worker processes: elastic growth and shrinkage, replacement of a
dead worker, cancellation, and a clean stop with work in flight."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from env_test_servers import REPO

from rlrun.common.config import PoolConfig
from rlrun.common.wire.plan import GenerationPlan, ModelEndpoint, PlanTarget
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.envs.code_sandbox import CodeSandbox
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.env_server.runtimes.registry import make_runtime
from rlrun.env_server.server.pool import JobCancelled, WorkerLost, WorkerPool
from rlrun.env_server.server.rollout import RolloutJob
from rlrun.env_server.server.worker import WorkerSpec
from rlrun.v1 import env_pb2, trace_pb2

from ...support.sandbox_procs import gone, sandbox_base, started

TASKS = ReverseText().taskset


def make_pool(tmp_path, **pool) -> WorkerPool:
    spec = WorkerSpec(
        env_key="reverse-text",
        env_id="reverse-text",
        env_args={},
        tokenizer_path=REPO / "configs/tokenizer/char",
        checkpoint_dir=None,
        max_model_len=32,
        log_dir=tmp_path,
    )
    return WorkerPool(spec, PoolConfig(**pool))


def job(address: str, i: int, n: int = 1) -> RolloutJob:
    target = PlanTarget(
        "policy", "train", ModelEndpoint("policy", "inference", [address]), SamplingParams(max_tokens=12)
    )
    return RolloutJob(
        "reverse-text",
        TASKS.get("train", i),
        GenerationPlan({"policy": target}),
        f"g{i}",
        [f"g{i}/{k}" for k in range(n)],
    )


async def until(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def traces(payload: bytes) -> list[trace_pb2.Trace]:
    return list(env_pb2.RunGroupResponse.FromString(payload).traces)


async def test_elastic_pool_grows_at_90_percent_of_capacity_and_shrinks_when_idle(
    tmp_path, inference, inference_server
):
    pool = make_pool(tmp_path, type="elastic", num_workers=1, max_workers=3, multiplex=4, idle_shrink_s=0.2)
    await pool.start()
    try:
        inference.hold = threading.Event()
        running = [
            asyncio.ensure_future(pool.run(i, job(inference_server.address, i), 60, asyncio.Event()))
            for i in range(3)
        ]
        await until(lambda: pool.in_flight == 3, "3 rollouts in flight")
        assert pool.size == 1  # 3 < 0.9 x 4
        running.append(
            asyncio.ensure_future(pool.run(3, job(inference_server.address, 3), 60, asyncio.Event()))
        )
        await until(lambda: pool.in_flight == 4, "4 rollouts in flight")
        assert pool.size == 2  # 4 >= 0.9 x 4: one more worker
        running += [
            asyncio.ensure_future(pool.run(i, job(inference_server.address, i), 60, asyncio.Event()))
            for i in range(4, 12)
        ]
        await until(lambda: pool.in_flight == 12, "12 rollouts in flight")
        assert (pool.size, pool.capacity) == (3, 12)  # capped at max_workers
        inference.hold.set()
        for payload in await asyncio.gather(*running):
            [trace] = traces(payload)
            assert trace.stop_condition == trace_pb2.STOP_CONDITION_COMPLETED and not trace.errors
        await until(lambda: pool.size == 1, "the pool to shrink back to num_workers")
        [payload] = await asyncio.gather(pool.run(99, job(inference_server.address, 99), 60, asyncio.Event()))
        assert not traces(payload)[0].errors
    finally:
        await pool.stop()
    assert pool.workers == []


async def test_static_pool_replaces_a_dead_worker_and_reports_its_jobs_lost(
    tmp_path, inference, inference_server
):
    pool = make_pool(tmp_path, type="static", num_workers=2, multiplex=8)
    await pool.start()
    try:
        inference.hold = threading.Event()
        doomed = asyncio.ensure_future(pool.run(1, job(inference_server.address, 1), 60, asyncio.Event()))
        await until(lambda: pool.in_flight == 1, "the job to start")
        [victim] = [w for w in pool.workers if w.in_flight]
        os.kill(victim.process.pid, signal.SIGKILL)
        with pytest.raises(WorkerLost):
            await doomed
        await until(
            lambda: (
                pool.size == 2 and victim not in pool.workers and all(w.ready.is_set() for w in pool.workers)
            ),
            "a replacement worker",
        )
        inference.hold.set()
        assert not traces(await pool.run(2, job(inference_server.address, 2), 60, asyncio.Event()))[0].errors
    finally:
        await pool.stop()


async def test_cancel_returns_running_jobs_early_and_drops_waiting_ones(
    tmp_path, inference, inference_server
):
    pool = make_pool(tmp_path, type="static", num_workers=1, multiplex=2)
    await pool.start()
    try:
        inference.hold = threading.Event()
        running_cancel, waiting_cancel = asyncio.Event(), asyncio.Event()
        running = asyncio.ensure_future(
            pool.run(1, job(inference_server.address, 1, n=2), 60, running_cancel)
        )
        await until(lambda: pool.in_flight == 2, "the first job to start")
        waiting = asyncio.ensure_future(pool.run(2, job(inference_server.address, 2), 60, waiting_cancel))
        await asyncio.sleep(0)
        waiting_cancel.set()
        with pytest.raises(JobCancelled):
            await waiting
        running_cancel.set()
        for trace in traces(await running):
            assert trace.stop_condition == trace_pb2.STOP_CONDITION_CANCELLED
    finally:
        await pool.stop()


async def test_stop_with_work_in_flight_returns_it_cancelled_and_leaves_no_process(
    tmp_path, inference, inference_server
):
    pool = make_pool(tmp_path, type="static", num_workers=2, multiplex=4)
    await pool.start()
    processes = [w.process for w in pool.workers]
    inference.hold = threading.Event()
    running = [
        asyncio.ensure_future(pool.run(i, job(inference_server.address, i, n=2), 60, asyncio.Event()))
        for i in range(3)
    ]
    await until(lambda: pool.in_flight == 6, "every job to start")
    await pool.stop()
    for payload in await asyncio.gather(*running):
        assert {t.stop_condition for t in traces(payload)} == {trace_pb2.STOP_CONDITION_CANCELLED}
    assert not any(p.is_alive() for p in processes)


async def test_a_worker_that_cannot_build_its_env_fails_the_start(tmp_path):
    spec = WorkerSpec(
        env_key="bad",
        env_id="no-such-env",
        env_args={},
        tokenizer_path=REPO / "configs/tokenizer/char",
        checkpoint_dir=None,
        max_model_len=32,
        log_dir=tmp_path,
    )
    pool = WorkerPool(spec, PoolConfig(num_workers=1))
    with pytest.raises(RuntimeError, match="exited with code 1"):
        await pool.start()
    assert pool.workers == []
    with pytest.raises(WorkerLost, match="stopping"):
        await pool.run(1, job("127.0.0.1:1", 1), 5, asyncio.Event())


async def test_a_worker_killed_mid_sandbox_command_leaves_no_process_and_its_pool_reaps_its_folder(
    tmp_path, inference, inference_server
):
    with sandbox_base() as base:
        runtime = {"type": "local", "root": str(base), "timeout_s": 60}
        spec = WorkerSpec(
            env_key="code-sandbox",
            env_id="code-sandbox",
            env_args={"max_tool_calls": 3},
            runtime=runtime,
            tokenizer_path=REPO / "configs/tokenizer/char",
            checkpoint_dir=None,
            max_model_len=128,
            log_dir=tmp_path,
        )
        pool = WorkerPool(spec, PoolConfig(type="static", num_workers=1), reap=make_runtime(runtime).reap)
        await pool.start()
        try:
            inference.policy = lambda tokenizer, prompt: "bash(sleep 37.1113)"
            target = PlanTarget(
                "policy",
                "train",
                ModelEndpoint("policy", "inference", [inference_server.address]),
                SamplingParams(max_tokens=40),
            )
            task = CodeSandbox().taskset.get("train", 3)
            doomed = asyncio.ensure_future(
                pool.run(
                    1,
                    RolloutJob("code-sandbox", task, GenerationPlan({"policy": target}), "g", ["g/0", "g/1"]),
                    60,
                    asyncio.Event(),
                )
            )
            assert await started("37.1113", count=2), "the sandboxed commands never started"
            [victim] = pool.workers
            assert (base / str(victim.process.pid)).is_dir()
            os.kill(victim.process.pid, signal.SIGKILL)
            with pytest.raises(WorkerLost):
                await doomed
            assert await gone("37.1113")  # bwrap's --die-with-parent and pid namespace
            assert not (base / str(victim.process.pid)).exists()  # reaped by the pool
        finally:
            await pool.stop()
