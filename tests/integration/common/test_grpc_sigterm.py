"""A service process started the standard way exits 0 on SIGTERM after going NOT_SERVING."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

from rlrun.common.grpc_client import open_channel, wait_for_health
from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

SCRIPT = textwrap.dedent(
    """
    import asyncio

    from rlrun.common.grpc_server import GrpcServer, ServerOptions, announce_ready
    from rlrun.common.logs import setup_logging
    from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc


    class Orchestrator(orchestrator_pb2_grpc.OrchestratorServiceServicer):
        async def GetStatus(self, request, context):
            await asyncio.sleep(0.5)
            return orchestrator_pb2.GetRunStatusResponse(step=1)


    async def main():
        setup_logging("sigterm-test")
        name = orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name
        srv = GrpcServer(ServerOptions(shutdown_grace_s=3.0), [name])
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(Orchestrator(), srv.server)
        srv.install_signal_handlers()  # before the loop has a server: installed by start()
        port = await srv.start()
        srv.set_serving(True)
        announce_ready("sigterm-test", "127.0.0.1", port)
        await srv.wait_for_termination()
        print("terminated", flush=True)


    asyncio.run(main())
    """
)


async def test_sigterm_exits_cleanly(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("rlrun sigterm-test listening on 127.0.0.1:"), (line, proc.poll())
        address = line.rsplit(" ", 1)[1].strip()
        await wait_for_health(address, timeout_s=5)
        async with open_channel(address) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            in_flight = asyncio.ensure_future(stub.GetStatus(orchestrator_pb2.GetRunStatusRequest()))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # the call in flight (0.5 s) completes within the grace
            assert (await asyncio.wait_for(in_flight, 3)).step == 1
        rc = await asyncio.to_thread(proc.wait, 5)
        elapsed = time.monotonic() - t0
        out, err = proc.communicate(timeout=5)
        assert rc == 0, err
        assert out.strip() == "terminated"
        assert elapsed < 3.0  # nothing in flight: no need to wait out the grace
        assert "SIGTERM" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
