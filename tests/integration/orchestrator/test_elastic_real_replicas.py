"""Inference scaled mid-run with real services: three `rlrun serve inference` replicas (tiny
torch model), an `rlrun serve env-server`, an `rlrun serve trainer` and the orchestrator, all
following one run file. `inference.addresses` goes 2 -> 3 -> 1 while the run trains (as the
operator rewrites it), and the removed replicas are then stopped, as scaling down deletes their
pods. Neither the trainer nor the env-server restarts; the added replica gets the live weights
and Generate calls, the removed ones get neither, and the run loses no group."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import urllib.request
from pathlib import Path

from rlrun.common import builtin
from rlrun.common.config import reload_config
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run
from rlrun.v1 import inference_pb2, inference_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
# The checks need 9 steps or so; the rest is room for a loaded machine, where a step may pass
# while a service picks up the new set (a run of 10 once ended before the last check).
STEPS = 24
GENERATED = re.compile(r"^rlrun_inference_generated_tokens_total (\S+)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_run_file(path: Path, replicas: list[str], env: str = "", trainer: str = "") -> None:
    path.write_text(
        f"""
output_dir = {json.dumps(str(path.parent / "out"))}
[model]
config = {json.dumps(str(REPO / "configs/models/tiny-gpt2-d64.json"))}
tokenizer = {json.dumps(str(builtin.tokenizer("lowercase")))}
init = "pytorch"
max_model_len = 32
[inference]
addresses = {json.dumps(replicas)}
[trainer]
address = {json.dumps(trainer)}
micro_batch_tokens = 4096
checkpoint.interval = 0
broadcast.resync_interval_s = 0.2
[orchestrator]
max_steps = {STEPS}
batch_size = 4
group_size = 2
max_off_policy_steps = {STEPS}
max_inflight_groups = 4
replica_refresh_s = 0.2
startup_timeout_s = 60
eval.enabled = false
train.sampling.max_completion_tokens = 8
[[orchestrator.train.env]]
id = "reverse-text"
address = {json.dumps(env)}
"""
    )


def generated_tokens(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        return float(GENERATED.search(reply.read().decode()).group(1))


async def version(service) -> int:
    stub = inference_pb2_grpc.InferenceServiceStub(service.channel)
    return (await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())).policy_version


async def at_step(status: RunStatus, run: asyncio.Task, step: int) -> None:
    while status.step < step:
        assert not run.done(), status.last_error
        await asyncio.sleep(0.05)


async def test_replicas_added_and_removed_mid_run_with_no_lost_group(tmp_path, spawn_service):
    run_file = tmp_path / "run.toml"
    write_run_file(run_file, [])
    serve = [sys.executable, "-m", "rlrun.cli", "serve"]
    ports = [free_port() for _ in range(3)]
    *replicas, env = await asyncio.gather(
        *(
            spawn_service([*serve, "inference", "--config", str(run_file), "--metrics-port", str(p)])
            for p in ports
        ),
        spawn_service([*serve, "env-server", "--config", str(run_file)]),
    )
    sets = [[r.address for r in replicas[:2]], [r.address for r in replicas], [replicas[2].address]]
    write_run_file(run_file, sets[0], env.address)
    trainer = await spawn_service([*serve, "trainer", "--config", str(run_file)])
    write_run_file(run_file, sets[0], env.address, trainer.address)

    status = RunStatus()
    orchestrator = Run(
        reload_config(run_file), status, addresses=lambda: reload_config(run_file).inference.addresses
    )
    run = asyncio.create_task(orchestrator.execute())
    trainer_log = tmp_path / "out" / "logs" / "trainer.log"

    async def picked_up(addresses: list[str]) -> None:
        """Both services follow the new set: the orchestrator's plans hold it, the trainer logged it."""
        line = f"inference replicas now: {', '.join(addresses)}"
        while orchestrator.replicas.addresses != addresses or line not in trainer_log.read_text():
            assert not run.done(), status.last_error
            await asyncio.sleep(0.05)

    async with asyncio.timeout(300):
        await at_step(status, run, 2)
        assert generated_tokens(ports[2]) == 0  # nobody knows it yet
        write_run_file(run_file, sets[1], env.address, trainer.address)
        await picked_up(sets[1])
        await at_step(status, run, 4)
        write_run_file(run_file, sets[2], env.address, trainer.address)
        await picked_up(sets[2])
        at_removal = generated_tokens(ports[2])
        # The trainer swaps its set between broadcasts: the step in flight may still reach them.
        await at_step(status, run, status.step + 1)
        removed_at = [await version(r) for r in replicas[:2]]
        await at_step(status, run, status.step + 2)
        assert [await version(r) for r in replicas[:2]] == removed_at  # no broadcast reaches them
        await asyncio.gather(*(r.stop() for r in replicas[:2]))  # scaled down: their pods go
        await run

    assert status.phase == "succeeded", status.last_error
    assert status.step == STEPS and status.groups_failed == 0 and status.groups_dropped_stale == 0
    assert await version(replicas[2]) == STEPS  # synced when added, then every step
    assert 0 < at_removal < generated_tokens(ports[2])  # from when it was added, and alone after the removal
