"""The orchestrator as a service: the status API, Stop, and `rlrun serve orchestrator` as a process."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import tomli_w

from rlrun.common.grpc_client import open_channel
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run
from rlrun.orchestrator.run.status import SERVICE_NAME, OrchestratorServicer
from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

STATUS = orchestrator_pb2.GetRunStatusRequest()


async def test_status_api_reports_progress_and_stop_ends_the_run(stack, tmp_path, serve):
    stack.trainer.delay = 0.05
    config = stack.config(
        tmp_path, max_steps=1000, eval={"enabled": False}, trainer={"checkpoint": {"interval": 0}}
    )
    status = RunStatus()
    run = Run(config, status)
    servicer = OrchestratorServicer(status, run.request_stop)
    add = orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server
    async with serve(SERVICE_NAME, add, servicer) as address, open_channel(address) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        pending = await stub.GetStatus(STATUS)
        assert pending.phase == orchestrator_pb2.RUN_PHASE_PENDING and pending.max_steps == 1000
        task = asyncio.create_task(run.execute())
        while (reply := await stub.GetStatus(STATUS)).step < 2:
            await asyncio.sleep(0.02)
        assert reply.phase == orchestrator_pb2.RUN_PHASE_RUNNING
        assert reply.policy_version >= 2 and reply.train_reward == 0.5 and reply.tokens_per_s > 0
        assert reply.metrics["reward_mean"] == 0.5
        stopped = await stub.Stop(orchestrator_pb2.StopRequest(reason="enough"))
        assert stopped.phase == orchestrator_pb2.RUN_PHASE_STOPPING
        await task
        final = await stub.GetStatus(STATUS)
    assert final.phase == orchestrator_pb2.RUN_PHASE_FAILED
    assert final.last_error == "stopped by request: enough"
    assert stack.trainer.checkpoints[-1][0] == stack.trainer.step  # a stopped run still checkpoints
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == final.step < 1000


async def start_orchestrator(raw: dict, tmp_path, *flags):
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(raw))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlrun.cli",
        "serve",
        "orchestrator",
        "--config",
        str(path),
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    ready = (await proc.stdout.readline()).decode().strip()
    return proc, ready


async def test_serve_exits_on_finish_with_the_runs_outcome(stack, tmp_path):
    raw = stack.raw(tmp_path, max_steps=2, eval={"enabled": False})
    proc, ready = await start_orchestrator(raw, tmp_path, "--exit-on-finish")
    assert ready.startswith("rlrun orchestrator listening on 127.0.0.1:"), ready
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert [b.step for b in stack.trainer.batches] == [0, 1]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["phase"] == "succeeded"
    assert (tmp_path / "run" / "logs" / "orchestrator.log").exists()

    raw = stack.raw(tmp_path, max_steps=2, algorithms=["nope"])
    proc, _ = await start_orchestrator(raw, tmp_path, "--exit-on-finish")
    await proc.communicate()
    assert proc.returncode == 1
    assert "algorithm 'nope'" in (tmp_path / "run" / "error.txt").read_text()


async def test_serve_keeps_serving_status_after_the_run_until_stop(stack, tmp_path):
    proc, ready = await start_orchestrator(
        stack.raw(tmp_path, max_steps=1, eval={"enabled": False}), tmp_path
    )
    address = ready.rsplit(" ", 1)[1]
    try:
        async with open_channel(address) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            while (reply := await stub.GetStatus(STATUS)).phase != orchestrator_pb2.RUN_PHASE_SUCCEEDED:
                assert reply.phase != orchestrator_pb2.RUN_PHASE_FAILED, reply.last_error
                await asyncio.sleep(0.05)
            assert proc.returncode is None  # still serving its final status
            assert (
                await stub.Stop(orchestrator_pb2.StopRequest())
            ).phase == orchestrator_pb2.RUN_PHASE_SUCCEEDED
        await proc.communicate()
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
