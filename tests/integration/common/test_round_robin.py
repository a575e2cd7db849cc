"""Load balancing across env-server replicas (issue 32 item 7): a channel from `open_channel`
spreads calls round-robin over every address its target resolves to. Two real gRPC servers
stand in for two env-server pods; the target lists both, as the DNS of a headless Service
returns every pod (`dns:///` in the operator's run file)."""

from __future__ import annotations

import grpc

from rlrun.common.grpc_client import ClientOptions
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.v1 import env_pb2, env_pb2_grpc


class Replica(env_pb2_grpc.EnvServiceServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def GetInfo(self, request, context):  # noqa: N802 - gRPC method name
        self.calls += 1
        return env_pb2.GetInfoResponse()


async def test_calls_reach_both_env_server_replicas():
    replicas, servers, ports = [Replica(), Replica()], [], []
    for replica in replicas:
        server = grpc.aio.server()
        env_pb2_grpc.add_EnvServiceServicer_to_server(replica, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    try:
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
        client = EnvClient(target, ClientOptions(deadline_s=5, retries=1))
        try:
            for _ in range(20):
                await client.stub.GetInfo(env_pb2.GetInfoRequest(), timeout=5)
        finally:
            await client.channel.close()
        # Round robin: both get calls, evenly once both subchannels are up.
        assert all(replica.calls >= 5 for replica in replicas), [r.calls for r in replicas]
        assert sum(r.calls for r in replicas) == 20
    finally:
        for server in servers:
            await server.stop(None)
