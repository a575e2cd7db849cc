"""`rlrun bench memory`: the env-server's and inference's resident memory under steady load.

Both run as `rlrun serve` processes with the demo config (configs/reverse_text.toml). Each
round sends 512 reverse-text rollouts, 64 RunGroup(n=8) calls with 32 in flight (256
rollouts); after each round, once the services are idle, the resident memory of each
service's process tree (its pool workers and engine process included) is read from /proc.
Round 2 is the baseline (round 1 pays for what is built once: caches, imports); the ratio of
the last round's memory to it is what each round keeps. The env-server's elastic pool may still
start workers in the rounds after it (a process each, a known size, not a leak): the processes of
each tree are counted after every round, and the growth is also given from the first round at
which the tree has its final number of processes (`..._steady_growth_mb`), which is what a
round keeps once the pool has its size. The last stdout line is JSON: `env_server_rss_ratio`,
`inference_rss_ratio` (last round / round 2), the growth in MB both ways, and the memory and
process count after every round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import grpc

from rlrun.bench import emit_result, stage
from rlrun.bench.env_server import CONFIG, ENV, GROUP_SIZE, Workload
from rlrun.bench.services import start_service, stop_service
from rlrun.common.procfs import descendants, tree_rss
from rlrun.v1 import env_pb2_grpc

ROLLOUTS_PER_ROUND, IN_FLIGHT = 512, 256
IDLE_S = 1.0
"""Pause after a round before its memory is read: the workers release theirs once idle."""


async def measure(rounds: int, log_dir: Path) -> dict:
    inference, inference_address = await start_service("inference", CONFIG, log_dir)
    env_server, env_address = await start_service("env-server", CONFIG, log_dir, "--env", ENV)
    groups = ROLLOUTS_PER_ROUND // GROUP_SIZE
    gate = asyncio.Semaphore(IN_FLIGHT // GROUP_SIZE)
    env_mb, inference_mb, env_procs, inference_procs = [], [], [], []
    try:
        work = Workload(inference_address)
        async with grpc.aio.insecure_channel(env_address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)

            async def group(idx: int) -> None:
                async with gate:
                    reply = await stub.RunGroup(work.group(idx), timeout=300)
                errors = [e for t in reply.traces for e in t.errors]
                if errors:
                    raise RuntimeError(f"the env-server returned errors: {errors[0]}")

            for r in range(rounds):
                await asyncio.gather(*(group(r * groups + g) for g in range(groups)))
                await asyncio.sleep(IDLE_S)
                env_mb.append(tree_rss(env_server.pid) / 2**20)
                inference_mb.append(tree_rss(inference.pid) / 2**20)
                env_procs.append(len(descendants(env_server.pid)))
                inference_procs.append(len(descendants(inference.pid)))
                stage(
                    f"round {r + 1}: env-server {env_mb[-1]:.1f} MB ({env_procs[-1]} processes), "
                    f"inference {inference_mb[-1]:.1f} MB ({inference_procs[-1]} processes)"
                )
    finally:
        await stop_service(env_server)
        await stop_service(inference)
    return {
        "rounds": rounds,
        "rollouts_per_round": ROLLOUTS_PER_ROUND,
        "in_flight": IN_FLIGHT,
        "env_server_rss_ratio": env_mb[-1] / env_mb[1],
        "inference_rss_ratio": inference_mb[-1] / inference_mb[1],
        "env_server_growth_mb": env_mb[-1] - env_mb[1],
        "inference_growth_mb": inference_mb[-1] - inference_mb[1],
        "env_server_steady_round": steady_round(env_procs),
        "inference_steady_round": steady_round(inference_procs),
        "env_server_steady_growth_mb": env_mb[-1] - env_mb[steady_round(env_procs) - 1],
        "inference_steady_growth_mb": inference_mb[-1] - inference_mb[steady_round(inference_procs) - 1],
        "env_server_rss_mb": env_mb,
        "inference_rss_mb": inference_mb,
        "env_server_processes": env_procs,
        "inference_processes": inference_procs,
    }


def steady_round(processes: list[int]) -> int:
    """The first round (from 2, counted from 1) after which a tree's process count no longer
    changes."""
    last_change = max((i for i in range(1, len(processes)) if processes[i] != processes[i - 1]), default=0)
    return max(2, last_change + 1)


def main(args: argparse.Namespace) -> int:
    log_dir = Path(os.environ.get("RLRUN_BENCH_DIR", "outputs/bench-memory"))
    result = asyncio.run(measure(6 if args.quick else 20, log_dir))
    last = result["rounds"]
    print(f"{result['rollouts_per_round']} rollouts per round, {result['in_flight']} in flight:")
    for name in ("env_server", "inference"):
        mb = result[f"{name}_rss_mb"]
        print(
            f"  {name.replace('_', '-'):10s} round 2 {mb[1]:7.1f} MB, round {last} {mb[-1]:7.1f} MB: "
            f"{result[f'{name}_rss_ratio']:.4f}x ({result[f'{name}_growth_mb']:+.1f} MB); from round "
            f"{result[f'{name}_steady_round']}, its last change of processes "
            f"({result[f'{name}_processes'][-1]}): {result[f'{name}_steady_growth_mb']:+.1f} MB"
        )
    return emit_result(result, args)
