"""The IPC broadcaster's staging buffer against replicas that take their time or fail: it is
never written while a replica may still read it. And "auto" routing replicas to it."""

from __future__ import annotations

import asyncio

import grpc
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.model import build_model
from rlrun.common.weights.grpc_stream import GrpcWeightBroadcaster, WeightAssembler
from rlrun.common.weights.ipc import IpcWeightBroadcaster, ipc_source
from rlrun.common.weights.protocol import TensorLayout, broadcast_tensors
from rlrun.common.weights.receiver import WeightReceiver
from rlrun.common.wire.weights import update_message_from_proto
from rlrun.trainer.synthetic import synthetic_config
from rlrun.trainer.weight_sync import AutoWeightBroadcaster
from rlrun.v1 import inference_pb2, inference_pb2_grpc
from rlrun.v1 import weights_pb2 as pb

from .conftest import INFERENCE
from .test_collective_broadcast import perturbed


class SlowIpcReplica(inference_pb2_grpc.InferenceServiceServicer):
    """Maps the trainer's buffer as a replica does, then reads it only after `delay_s`; `fail`:
    every IPC update fails after that. Takes gRPC updates too."""

    def __init__(self, expected: dict[str, torch.Tensor], delay_s: float, fail: bool = False):
        self.expected = expected
        self.delay_s = delay_s
        self.fail = fail
        self.receiver = WeightReceiver(torch.device("cpu"))
        self.received: list[tuple[int, str, dict[str, torch.Tensor]]] = []
        self.info = pb.WeightSyncInfo()
        """What it reports in GetStatus."""

    async def UpdateWeights(self, request_iterator, context):
        header = update_message_from_proto(await anext(request_iterator))
        if header.transport != "ipc":
            assembler = WeightAssembler(header, TensorLayout(header.tensors, self.expected))
            async for message in request_iterator:
                assembler.add(update_message_from_proto(message))
            self.received.append((header.version, "", dict(assembler.finish())))
            return inference_pb2.UpdateWeightsResponse(version=header.version)
        views = self.receiver.source(ipc_source(header, self.expected)).open()
        await asyncio.sleep(self.delay_s)
        if self.fail:
            await context.abort(grpc.StatusCode.INTERNAL, "this replica fails")
        copies = {name: tensor.clone() for name, tensor in views.items()}
        self.received.append((header.version, header.ipc.buffer_id, copies))
        return inference_pb2.UpdateWeightsResponse(version=header.version)

    async def GetStatus(self, request, context):
        return inference_pb2.GetInferenceStatusResponse(weight_sync=self.info)


async def serve(servicer) -> tuple[str, GrpcServer]:
    server = GrpcServer(ServerOptions(shutdown_grace_s=0), [INFERENCE])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server.server)
    port = await server.start()
    return f"127.0.0.1:{port}", server


def equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(got[name], want[name]) for name in want)


async def test_the_buffer_is_not_written_until_every_replica_answered(tmp_path):
    base = broadcast_tensors(build_model(synthetic_config(tmp_path).model))
    fast, slow = SlowIpcReplica(base, 0.0), SlowIpcReplica(base, 0.5)
    (fast_address, fast_server), (slow_address, slow_server) = await serve(fast), await serve(slow)
    broadcaster = IpcWeightBroadcaster(
        [fast_address, slow_address], BroadcastConfig(retries=0), ClientOptions()
    )
    first, second = perturbed(base, 1), perturbed(base, 2)
    try:
        results = await asyncio.gather(broadcaster.broadcast(first, 1), broadcaster.broadcast(second, 2))
        assert [[r.ok for r in rs] for rs in results] == [[True, True], [True, True]]
        for replica in (fast, slow):
            (v1, id1, got1), (v2, id2, got2) = replica.received
            assert (v1, v2) == (1, 2) and id1 == id2  # one buffer, exported once
            assert equal(got1, first) and equal(got2, second)
    finally:
        await broadcaster.close()
        await fast_server.stop(0)
        await slow_server.stop(0)


async def test_a_failed_replica_retires_the_buffer(tmp_path):
    base = broadcast_tensors(build_model(synthetic_config(tmp_path).model))
    good, bad = SlowIpcReplica(base, 0.0), SlowIpcReplica(base, 0.0, fail=True)
    (good_address, good_server), (bad_address, bad_server) = await serve(good), await serve(bad)
    broadcaster = IpcWeightBroadcaster(
        [good_address, bad_address], BroadcastConfig(retries=0), ClientOptions()
    )
    try:
        results = await broadcaster.broadcast(perturbed(base, 1), 1)
        assert [r.ok for r in results] == [True, False]
        assert "INTERNAL" in results[1].error and results[1].bytes == 0
        assert results[0].bytes == sum(t.nbytes for t in base.values())
        assert broadcaster.staging is None
        # The bad replica may still read the old buffer; the next update gets a new one.
        assert [r.ok for r in await broadcaster.broadcast(perturbed(base, 2), 2, [good_address])] == [True]
        (_, id1, _), (_, id2, got2) = good.received
        assert id1 != id2 and equal(got2, perturbed(base, 2))
    finally:
        await broadcaster.close()
        await good_server.stop(0)
        await bad_server.stop(0)


async def test_auto_sends_each_replica_what_it_reports_and_forgets_a_failed_one(
    tmp_path, start_replica, dead_address
):
    base = broadcast_tensors(build_model(synthetic_config(tmp_path).model))
    fetching = SlowIpcReplica(base, 0.0)
    fetching_address, fetching_server = await serve(fetching)
    streaming = await start_replica()  # reports nothing: an older replica
    addresses = [fetching_address, streaming.address, dead_address]
    settings, client = BroadcastConfig(retries=0), ClientOptions()
    by_transport = {
        "grpc": GrpcWeightBroadcaster(addresses, settings, client),
        "ipc": IpcWeightBroadcaster(addresses, settings, client),
    }
    # A trainer on "cuda" that stages on CPU: the routing is what is under test.
    auto = AutoWeightBroadcaster(addresses, by_transport, client, settings, torch.device("cuda"))
    fetching.info = pb.WeightSyncInfo(
        node_id=auto.node, device="cuda:0", transports=[pb.WEIGHT_TRANSPORT_IPC]
    )
    try:
        weights = perturbed(base, 3)
        results = await auto.broadcast(weights, 3)
        assert [(r.address, r.ok) for r in results] == [(a, a != dead_address) for a in addresses]
        assert auto.choices == {fetching_address: "ipc", streaming.address: "grpc"}
        assert equal(fetching.received[0][2], weights)
        assert streaming.servicer.version == 3 and equal(streaming.servicer.weights, weights)
        # A replica that fails an update is asked again next time (it may come back as another).
        await fetching_server.stop(0)
        results = await auto.broadcast(weights, 4, [fetching_address, streaming.address])
        assert [r.ok for r in results] == [False, True]
        assert auto.choices == {streaming.address: "grpc"}
    finally:
        await auto.close()
        await fetching_server.stop(0)


async def test_auto_falls_back_to_grpc_for_a_replica_that_cannot_fetch(tmp_path):
    base = broadcast_tensors(build_model(synthetic_config(tmp_path).model))
    replica = SlowIpcReplica(base, 0.0, fail=True)
    address, server = await serve(replica)
    settings, client = BroadcastConfig(retries=0), ClientOptions()
    by_transport = {
        "grpc": GrpcWeightBroadcaster([address], settings, client),
        "ipc": IpcWeightBroadcaster([address], settings, client),
    }
    auto = AutoWeightBroadcaster([address], by_transport, client, settings, torch.device("cuda"))
    replica.info = pb.WeightSyncInfo(node_id=auto.node, device="cuda:0", transports=[pb.WEIGHT_TRANSPORT_IPC])
    try:
        for version in (1, 2):
            (result,) = await auto.broadcast(perturbed(base, version), version)
            assert result.ok, result.error
        # The first update failed over IPC and went over gRPC; the second went over gRPC only.
        assert [(v, buffer_id) for v, buffer_id, _ in replica.received] == [(1, ""), (2, "")]
        assert equal(replica.received[1][2], perturbed(base, 2))
        assert auto.choices == {address: "grpc"}
    finally:
        await auto.close()
        await server.stop(0)
