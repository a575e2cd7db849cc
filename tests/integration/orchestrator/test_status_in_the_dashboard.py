"""`rlrun dashboard --orchestrator HOST:PORT`: a run followed through its orchestrator's status
service alone (a cluster run through `kubectl port-forward`), with the run's gRPC token. The
orchestrator is the real Run behind the real OrchestratorServicer; the dashboard a process."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import urllib.request

from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run
from rlrun.orchestrator.run.status import SERVICE_NAME, OrchestratorServicer
from rlrun.v1 import orchestrator_pb2_grpc

TOKEN = "grpc-token-9e2a"
LISTENING = re.compile(r"rlrun dashboard: (http://\S+?)/? \(")


async def start_dashboard(*args: str):
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlrun.cli",
        "dashboard",
        "--isolated",
        "--port",
        "0",
        *args,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    while line := (await asyncio.wait_for(process.stderr.readline(), 60)).decode():
        if m := LISTENING.search(line):
            return process, m[1]
    raise AssertionError(f"the dashboard exited with {await process.wait()}")


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


async def remote_run(url: str) -> dict:
    runs = (await asyncio.to_thread(get, f"{url}/api/runs"))["runs"]
    assert len(runs) == 1 and runs[0]["id"].startswith("orch-")
    return runs[0]


async def test_a_run_is_followed_through_its_status_service(stack, tmp_path):
    stack.trainer.delay = 1.5  # a step takes longer than the dashboard's poll
    config = stack.config(tmp_path, max_steps=5, eval={"num_tasks": 4, "interval": 2})
    status = RunStatus()
    run = Run(config, status)
    server = GrpcServer(
        ServerOptions(host="127.0.0.1", port=0, shutdown_grace_s=0.0, auth_token=TOKEN), [SERVICE_NAME]
    )
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(
        OrchestratorServicer(status, run.request_stop), server.server
    )
    await server.start()
    server.set_serving(True)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    watching, url = await start_dashboard(
        "--orchestrator", server.address, "--orchestrator-token-file", str(token_file)
    )
    refused, refused_url = await start_dashboard("--orchestrator", server.address)  # without the token
    try:
        await run.execute()
        assert status.phase == "succeeded", status.last_error
        deadline = time.monotonic() + 30
        while (info := await remote_run(url))["phase"] != "succeeded":
            assert time.monotonic() < deadline, info
            await asyncio.sleep(0.2)
        rid = info["id"]
        seen = (await asyncio.to_thread(get, f"{url}/api/runs/{rid}/metrics"))["rows"]
        denied = await remote_run(refused_url)
        detail = await asyncio.to_thread(get, f"{refused_url}/api/runs/{denied['id']}")
    finally:
        for process in (watching, refused):
            process.terminate()
            await process.wait()
        await server.stop(0.0)
    written = {
        r["step"]: r
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    }
    rl = [r for r in seen if r["phase"] == "rl"]
    assert len(rl) >= 3 and len({r["step"] for r in rl}) == len(rl), rl
    for row in rl:  # every step the dashboard saw is the step the run wrote
        assert row["reward_mean"] == written[row["step"]]["reward_mean"]
        assert row["trainer_step"] == written[row["step"]]["trainer_step"]
    assert [r["eval_reward"] for r in seen if r["phase"] == "eval"][-1] == status.eval_reward
    assert info["step"] == 5 and info["max_steps"] == 5 and info["policy_version"] == status.version
    assert denied["phase"] == "unreachable" and "UNAUTHENTICATED" in detail["error"]
