"""Inference scaled under a running orchestrator: the run file's `inference.addresses` goes
from 2 to 3 to 1 replicas mid-run (as the operator rewrites it), and the RunGroup requests
sent after each change carry the new set in the live policy's plan (the env-servers generate
where the plan says), with no group lost and no restart."""

from __future__ import annotations

import contextlib

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run
from rlrun.v1 import inference_pb2_grpc

from .conftest import INFERENCE_SERVICE, FakeInference


async def test_the_replica_set_follows_the_run_file_mid_run(stack, serve, tmp_path):
    async with contextlib.AsyncExitStack() as exits:
        more = [
            await exits.enter_async_context(
                serve(
                    INFERENCE_SERVICE,
                    inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                    FakeInference(),
                )
            )
            for _ in range(2)
        ]
        first = stack.addresses["inference"]
        sets = [[first, more[0]], [first, more[0], more[1]], [more[1]]]
        config = stack.config(tmp_path, max_steps=6, replica_refresh_s=0.02, eval={"interval": 0})
        config.inference.addresses = sets[0]
        stack.trainer.delay = 0.3  # each step outlasts several re-reads of the run file

        def run_file_addresses() -> list[str]:  # 2 replicas for steps 0-1, 3 for 2-3, then 1
            return sets[min(stack.trainer.step // 2, 2)]

        status = RunStatus()
        await Run(config, status, addresses=run_file_addresses).execute()

    assert status.phase == "succeeded", status.last_error
    assert [b.step for b in stack.trainer.batches] == list(range(6))
    assert status.groups_failed == 0 and status.groups_dropped_stale == 0
    seen = []  # the replica sets, in the order the RL groups carried them
    for call in stack.env.calls:
        if call.group_id.startswith("rl"):
            policy = list(call.plan.targets[0].model.addresses)
            assert policy in sets, policy
            assert list(call.plan.text_addresses) == policy
            if not seen or seen[-1] != policy:
                seen.append(policy)
    assert seen == sets
