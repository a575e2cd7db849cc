"""The collective weight-broadcast protocol (the NCCL path), run over gloo on CPU: a gRPC
handshake per replica, then the tensors over a process group the replicas join."""

from __future__ import annotations

import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.model import build_model
from rlrun.common.weights.collective import CollectiveWeightBroadcaster
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.trainer.synthetic import synthetic_config


def perturbed(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: v + torch.randn(v.shape, generator=gen) for k, v in tensors.items()}


async def test_collective_broadcast_reaches_live_replicas_and_reports_the_dead_one(
    start_replica, dead_address, tmp_path
):
    first, second = await start_replica(), await start_replica()
    addresses = [first.address, dead_address, second.address]
    settings = BroadcastConfig(retries=1, timeout_s=30)
    broadcaster = CollectiveWeightBroadcaster(
        addresses, settings, ClientOptions(), host="127.0.0.1", backend="gloo"
    )
    base = broadcast_tensors(build_model(synthetic_config(tmp_path).model))
    try:
        for version in (1, 2):
            weights = perturbed(base, version)
            results = await broadcaster.broadcast(weights, version)
            assert [r.address for r in results] == addresses
            assert [r.ok for r in results] == [True, False, True]
            assert "not reachable" in results[1].error and "UNAVAILABLE" in results[1].error
            for replica in (first, second):
                assert replica.servicer.version == version
                assert all(torch.equal(replica.servicer.weights[k], weights[k]) for k in weights)
        # The set of live replicas did not change, so both updates used one group.
        assert broadcaster.generation == 1
        assert [key[-1] for key in first.servicer.groups] == ["rlrun-weights-1"]
        assert {key[3] for key in (*first.servicer.groups, *second.servicer.groups)} == {1, 2}

        await second.server.stop(0)
        results = await broadcaster.broadcast(perturbed(base, 3), 3)
        assert [r.ok for r in results] == [True, False, False]
        assert first.servicer.version == 3 and broadcaster.generation == 2
    finally:
        await broadcaster.close()


async def test_each_replica_gets_as_many_ranks_as_its_tensor_parallel_workers(start_replica, tmp_path):
    first, second = await start_replica(ranks=2), await start_replica(ranks=2)
    broadcaster = CollectiveWeightBroadcaster(
        [first.address, second.address],
        BroadcastConfig(retries=1, timeout_s=30),
        ClientOptions(),
        host="127.0.0.1",
        backend="gloo",
        ranks_per_replica=2,
        device="cpu",
    )
    weights = perturbed(broadcast_tensors(build_model(synthetic_config(tmp_path).model)), 7)
    try:
        results = await broadcaster.broadcast(weights, 1)
    finally:
        await broadcaster.close()
    assert [r.ok for r in results] == [True, True]
    assert sorted(key[3] for key in first.servicer.groups) == [1, 2]
    assert sorted(key[3] for key in second.servicer.groups) == [3, 4]
    assert {key[2] for key in first.servicer.groups} == {5}
    assert all(torch.equal(second.servicer.weights[k], weights[k]) for k in weights)
