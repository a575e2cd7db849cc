"""`rlrun bench env-server`: what the env-server adds per rollout over calling inference directly.

Both paths run against the same `rlrun serve inference` process (the demo's tiny model and
config, configs/reverse_text.toml) in demo-shaped steps: 16 reverse-text tasks x 8 rollouts,
all in flight at once.
- baseline: the client renders each prompt itself and calls Generate(n=8) per task;
- env-server: the client calls RunGroup(n=8) per task on `rlrun serve env-server`, which
  renders, generates (one Generate(n=8) per group), scores, validates and returns traces.
Each request carries the same seed on both paths, so both decode the same tokens. Steps of
the two kinds alternate; the figures are medians. Also the latency of single sequential
rollouts (RunRollout vs Generate n=1). The last stdout line is JSON with the key
`overhead_per_rollout_ms` (= (env-server step − baseline step) / rollouts per step).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import grpc

from rlrun.bench import emit_result
from rlrun.bench.local_runs import DEMO_CONFIG
from rlrun.bench.services import served
from rlrun.common.config import load_config
from rlrun.common.tokenizer import load_tokenizer
from rlrun.env_server.envs.reverse_text import ReverseText
from rlrun.v1 import env_pb2, env_pb2_grpc, inference_pb2, inference_pb2_grpc, plan_pb2

CONFIG = DEMO_CONFIG
ENV = "reverse-text"
GROUPS, GROUP_SIZE = 16, 8


class Workload:
    """The same tasks, sampling and seeds for both paths."""

    def __init__(self, inference_address: str):
        config = load_config(CONFIG)
        self.tokenizer = load_tokenizer(config.model.tokenizer, config.model.path)
        self.max_tokens = config.orchestrator.train.sampling.max_completion_tokens
        self.temperature = config.orchestrator.train.sampling.temperature
        self.tasks = ReverseText(**config.orchestrator.train.env[0].args).taskset
        self.address = inference_address

    def sampling(self, seed: int, n: int) -> dict:
        return {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
            "n": n,
            "stop_token_ids": self.tokenizer.stop_token_ids,
        }

    def prompt(self, idx: int) -> list[int]:
        text = self.tasks.get("train", idx).prompt
        return self.tokenizer.render_message("user", text) + self.tokenizer.message_header("assistant")

    def generate(self, idx: int, n: int) -> inference_pb2.GenerateRequest:
        return inference_pb2.GenerateRequest(
            prompt_token_ids=self.prompt(idx), sampling=self.sampling(idx, n)
        )

    def plan(self, idx: int) -> plan_pb2.GenerationPlan:
        sampling = self.sampling(idx, 1)
        del sampling["n"]
        return plan_pb2.GenerationPlan(
            targets=[
                plan_pb2.PlanTarget(
                    member_id="policy",
                    role=plan_pb2.MEMBER_ROLE_TRAIN,
                    sampling=sampling,
                    model=plan_pb2.ModelEndpoint(
                        name="policy", kind=plan_pb2.ENDPOINT_KIND_INFERENCE, addresses=[self.address]
                    ),
                )
            ]
        )

    def group(self, idx: int) -> env_pb2.RunGroupRequest:
        return env_pb2.RunGroupRequest(
            group_id=f"bench-{idx}",
            task={"env": ENV, "split": "train", "idx": idx},
            plan=self.plan(idx),
            n=GROUP_SIZE,
        )

    def rollout(self, idx: int) -> env_pb2.RunRolloutRequest:
        return env_pb2.RunRolloutRequest(
            rollout_id=f"bench-r{idx}", task={"env": ENV, "split": "train", "idx": idx}, plan=self.plan(idx)
        )


async def timed(call) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def measure(quick: bool, log_dir: Path) -> dict:
    steps, singles = (4, 20) if quick else (30, 200)
    async with (
        served("inference", CONFIG, log_dir) as inference_address,
        served("env-server", CONFIG, log_dir, "--env", ENV) as env_address,
    ):
        work = Workload(inference_address)
        async with (
            grpc.aio.insecure_channel(inference_address) as ic,
            grpc.aio.insecure_channel(env_address) as ec,
        ):
            generate = inference_pb2_grpc.InferenceServiceStub(ic).Generate
            env = env_pb2_grpc.EnvServiceStub(ec)

            async def direct_step(first: int) -> None:
                replies = await asyncio.gather(
                    *(generate(work.generate(first + g, GROUP_SIZE), timeout=120) for g in range(GROUPS))
                )
                assert all(len(r.completions) == GROUP_SIZE for r in replies)

            async def env_step(first: int) -> None:
                replies = await asyncio.gather(
                    *(env.RunGroup(work.group(first + g), timeout=120) for g in range(GROUPS))
                )
                errors = [e for r in replies for t in r.traces for e in t.errors]
                if errors:
                    raise RuntimeError(f"the env-server returned errors: {errors[0]}")

            direct_s, env_s = [], []
            for step in range(-2, steps):  # two warm-up steps of each kind
                first = (step + 2) * GROUPS
                d, e = await timed(lambda f=first: direct_step(f)), await timed(lambda f=first: env_step(f))
                if step >= 0:
                    direct_s.append(d)
                    env_s.append(e)
            single_direct, single_env = [], []
            for i in range(singles):
                single_direct.append(
                    await timed(lambda i=i: generate(work.generate(10_000 + i, 1), timeout=60))
                )
                single_env.append(
                    await timed(lambda i=i: env.RunRollout(work.rollout(10_000 + i), timeout=60))
                )
    rollouts = GROUPS * GROUP_SIZE
    direct, via_env = statistics.median(direct_s), statistics.median(env_s)
    one_direct, one_env = statistics.median(single_direct), statistics.median(single_env)
    return {
        "rollouts_per_step": rollouts,
        "steps": steps,
        "direct_step_ms": direct * 1e3,
        "env_server_step_ms": via_env * 1e3,
        "step_ratio_vs_direct": via_env / direct,
        "overhead_per_rollout_ms": (via_env - direct) * 1e3 / rollouts,
        "single_direct_ms": one_direct * 1e3,
        "single_env_server_ms": one_env * 1e3,
        "overhead_per_single_rollout_ms": (one_env - one_direct) * 1e3,
    }


def main(args: argparse.Namespace) -> int:
    log_dir = Path(os.environ.get("RLRUN_BENCH_DIR", "outputs/bench-env-server"))
    result = asyncio.run(measure(args.quick, log_dir))
    print(f"step of {GROUPS} groups x {GROUP_SIZE} rollouts, median of {result['steps']}:")
    print(f"  baseline, Generate(n={GROUP_SIZE}) per group:   {result['direct_step_ms']:8.2f} ms")
    print(
        f"  env-server, RunGroup(n={GROUP_SIZE}) per group: {result['env_server_step_ms']:8.2f} ms "
        f"({result['step_ratio_vs_direct']:.3f}x the baseline)"
    )
    print(f"  overhead per rollout: {result['overhead_per_rollout_ms']:.3f} ms")
    print(
        f"single rollouts one at a time: Generate {result['single_direct_ms']:.2f} ms, RunRollout "
        f"{result['single_env_server_ms']:.2f} ms, overhead {result['overhead_per_single_rollout_ms']:.2f} ms"
    )
    return emit_result(result, args)
