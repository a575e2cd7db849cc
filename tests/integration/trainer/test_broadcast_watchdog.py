"""The weight-sync watchdog, against real `rlrun serve inference` processes: one SIGSTOPped
(it stalls: it holds its connections but reads and answers nothing) ends the step's broadcast
at `trainer.broadcast.timeout_s`, with that replica reported failed and a warning naming it;
the next steps go on without it, and once it answers again the trainer's replica watch pushes
it the current weights. Over each transport a CPU trainer has: the gRPC stream, IPC (shared
memory) and the collective (gloo standing in for NCCL), where the stall is caught by the
pre-transfer probe, so the group forms without it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import pytest

from rlrun.common.grpc_client import ClientOptions
from rlrun.common.wire.training import batch_to_proto
from rlrun.trainer.replica_watch import ReplicaWatch
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import inference_pb2, inference_pb2_grpc, trainer_pb2

TIMEOUT_S = 3.0


async def submit(trainer, step: int) -> trainer_pb2.SubmitBatchResponse:
    batch = batch_to_proto(synthetic_batch(step))
    return await trainer.stub.SubmitBatch(trainer_pb2.SubmitBatchRequest(batch=batch))


async def version(stub) -> int:
    return (await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())).policy_version


@pytest.mark.parametrize("transport", ["grpc", "ipc", "nccl"])
async def test_a_stalled_replica_is_dropped_at_the_timeout_and_resynced_when_it_answers(
    transport, tmp_path, spawn_service, start_trainer, write_run_file, caplog
):
    run_file = write_run_file(tmp_path / "run.toml", tmp_path / "out", [], {})
    serve = [sys.executable, "-m", "rlrun.cli", "serve", "inference", "--config", str(run_file)]
    live, stalled = await asyncio.gather(spawn_service(serve), spawn_service(serve))
    live_stub, stalled_stub = (inference_pb2_grpc.InferenceServiceStub(s.channel) for s in (live, stalled))
    # Small chunks: the gRPC stream is many messages, so the stalled replica stops reading partway.
    broadcast = {
        "transport": transport,
        "retries": 1,
        "timeout_s": TIMEOUT_S,
        "chunk_mb": 0.01,
        "resync_interval_s": 0.2,
        "nccl_host": "127.0.0.1",
    }
    trainer = await start_trainer([live.address, stalled.address], broadcast=broadcast)
    reply = await submit(trainer, 0)
    assert [b.ok for b in reply.broadcasts] == [True, True], [b.error for b in reply.broadcasts]
    assert trainer.runtime.broadcaster.transport == transport

    watch = ReplicaWatch(trainer.runtime, ClientOptions(), broadcast["resync_interval_s"])
    watching = asyncio.create_task(watch.run())
    os.kill(stalled.process.pid, signal.SIGSTOP)
    try:
        caplog.set_level(logging.WARNING, logger="rlrun.trainer")
        started = time.perf_counter()
        async with asyncio.timeout(10 * TIMEOUT_S):  # a hang fails here, not the whole suite
            reply = await submit(trainer, 1)
        took = time.perf_counter() - started
        by_address = {b.address: b for b in reply.broadcasts}
        assert reply.policy_version == 2
        assert by_address[live.address].ok and await version(live_stub) == 2
        assert not by_address[stalled.address].ok
        assert "DEADLINE_EXCEEDED" in by_address[stalled.address].error, by_address[stalled.address]
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(stalled.address in m and "missed version 2" in m for m in warned), warned
        print(f"{transport}: the stalled broadcast ended after {took:.2f}s (timeout_s = {TIMEOUT_S:g})")

        # Left out while it stays silent: the next step's broadcast does not wait for it again.
        reply = await submit(trainer, 2)
        assert [b.address for b in reply.broadcasts] == [live.address] and reply.broadcasts[0].ok
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)
    try:
        async with asyncio.timeout(60):
            while True:  # the watch re-syncs it within a probe or two
                if await version(stalled_stub) == 3:
                    break
                await asyncio.sleep(0.1)
        assert stalled.address not in trainer.runtime.left_out
        reply = await submit(trainer, 3)  # back in the broadcasts
        assert [b.ok for b in reply.broadcasts] == [True, True], [b.error for b in reply.broadcasts]
        assert [await version(s) for s in (live_stub, stalled_stub)] == [4, 4]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await watch.close()
