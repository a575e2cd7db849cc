"""`rlrun bench verifiers`: a one-turn verifiers v1 env against the same task as a native env.

The task is the demo's (reverse 3 to 8 lowercase letters, scored by similarity), in the run
file tests/support/vf_envs/vf_reverse_text.toml (the demo's model and recipe): once as that
file's verifiers env `vf:vf_reverse_text` (a `vf.Taskset` whose task scores with an async
`@vf.reward`, and an in-process chat harness, in tests/support/vf_envs; its folder is put on
PYTHONPATH), once as the built-in native env `reverse-text` in its place. Both are run from a
checkout, as `make bench` does.

1. env-server step: one inference replica (with its HTTP API, which verifiers' train client
   calls) and one env-server per env; steps of 16 groups x 8 rollouts (RunGroup, all in
   flight at once, the plan the orchestrator sends) alternate between the two; medians.
   `env_server_step_ratio` = verifiers / native; `overhead_per_rollout_ms` is the difference
   per rollout. Also the CPU time per rollout of each env-server (its worker processes) and of
   the inference replica (its engine process) during each kind's steps: what the rollouts cost,
   whatever else the machine runs.
2. RL step: `rlrun local` on the run file, once with each env, without warm start or eval;
   `rl_step_ratio` = the verifiers run's median RL step time / the native run's (target <= 1.5).

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import grpc

from rlrun.bench import emit_result, stage
from rlrun.bench.local_runs import run_local, timing_overrides
from rlrun.bench.services import free_port, start_service, stop_service
from rlrun.common.config import POLICY, load_config
from rlrun.common.wire import plan_to_proto
from rlrun.orchestrator.run.plan import compile_plan, sampling_params, with_chat_format
from rlrun.v1 import env_pb2, env_pb2_grpc, inference_pb2, inference_pb2_grpc, plan_pb2

ENVS_DIR = Path("tests/support/vf_envs")
CONFIG = ENVS_DIR / "vf_reverse_text.toml"
NATIVE = ['orchestrator.train.env.0.id="reverse-text"', "orchestrator.train.env.0.args={}"]
"""The run file with the native env in the verifiers env's place (same name, same task)."""
GROUPS, GROUP_SIZE = 16, 8


def _environ() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ENVS_DIR.resolve()), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}


async def _plan(inference: str, http: str) -> plan_pb2.GenerationPlan:
    """The training plan the orchestrator would send for the run file's env."""
    config = load_config(
        CONFIG, [f'inference.addresses=["{inference}"]', f'inference.http_addresses=["{http}"]']
    )
    orch = config.orchestrator
    sampling = sampling_params(orch.train.sampling, orch.train.env[0].sampling)
    plan = plan_to_proto(compile_plan(config, actor=POLICY, sampling=sampling))
    async with grpc.aio.insecure_channel(inference) as channel:
        status = await inference_pb2_grpc.InferenceServiceStub(channel).GetStatus(
            inference_pb2.GetInferenceStatusRequest(), timeout=60
        )
    return with_chat_format(plan, status.tokenizer, [inference])


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process and its children alive now have used (from
    /proc: an env-server's work is in its worker processes, an inference replica's in its
    engine process). Unlike wall time, it does not grow with what else the machine runs."""
    ticks = os.sysconf("SC_CLK_TCK")

    def stat(name: str) -> list[str] | None:
        try:
            return Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            return None

    total = 0.0
    for name in os.listdir("/proc"):
        fields = stat(name) if name.isdigit() else None
        if fields is not None and (int(name) == pid or int(fields[1]) == pid):
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def env_server_steps(steps: int, log_dir: Path) -> dict:
    os.environ.update(_environ())  # the env-servers this starts import the verifiers env
    key = load_config(CONFIG).orchestrator.train.env[0].key
    http = free_port()
    started = []
    try:
        for service, logs, args, overrides in (
            ("inference", log_dir, ("--http-port", str(http)), ()),
            ("env-server", log_dir / "vf", (), ()),
            ("env-server", log_dir / "native", (), NATIVE),
        ):
            started.append(await start_service(service, CONFIG, logs, *args, overrides=overrides))
        (inference_process, inference), (vf_process, vf_address), (native_process, native_address) = started
        plan = await _plan(inference, f"http://127.0.0.1:{http}")
        async with (
            grpc.aio.insecure_channel(vf_address) as vf_channel,
            grpc.aio.insecure_channel(native_address) as native_channel,
        ):
            stubs = {
                "verifiers": env_pb2_grpc.EnvServiceStub(vf_channel),
                "native": env_pb2_grpc.EnvServiceStub(native_channel),
            }
            processes = {"verifiers": vf_process.pid, "native": native_process.pid}

            async def step(kind: str, first: int) -> tuple[float, float, float]:
                """Wall seconds, and CPU seconds of the env-server and of inference."""
                cpu = cpu_seconds(processes[kind]), cpu_seconds(inference_process.pid)
                began = time.perf_counter()
                replies = await asyncio.gather(
                    *(
                        stubs[kind].RunGroup(
                            env_pb2.RunGroupRequest(
                                group_id=f"bench-{kind}-{first + g}",
                                task={"env": key, "split": "train", "idx": first + g},
                                plan=plan,
                                n=GROUP_SIZE,
                            ),
                            timeout=600,
                        )
                        for g in range(GROUPS)
                    )
                )
                wall = time.perf_counter() - began
                errors = [e for r in replies for t in r.traces for e in t.errors]
                if errors:
                    raise RuntimeError(f"the {kind} env-server's rollouts failed: {errors[0]}")
                env_cpu = cpu_seconds(processes[kind]) - cpu[0]
                return wall, env_cpu, cpu_seconds(inference_process.pid) - cpu[1]

            times: dict[str, list[tuple[float, float, float]]] = {"verifiers": [], "native": []}
            for number in range(-1, steps):  # one warm-up step of each
                stage(f"env-server step {number + 1} of {steps} (+1 warm-up), each env")
                for kind in times:
                    measured = await step(kind, (number + 1) * GROUPS)
                    if number >= 0:
                        times[kind].append(measured)
    finally:
        for process, _ in reversed(started):
            await stop_service(process)
    rollouts = GROUPS * GROUP_SIZE

    def median(kind: str, column: int) -> float:
        return statistics.median(row[column] for row in times[kind])

    vf, native = median("verifiers", 0), median("native", 0)
    return {
        "env_server_rollouts_per_step": rollouts,
        "env_server_native_step_ms": native * 1e3,
        "env_server_verifiers_step_ms": vf * 1e3,
        "env_server_step_ratio": vf / native,
        "overhead_per_rollout_ms": (vf - native) * 1e3 / rollouts,
        "native_env_server_cpu_ms_per_rollout": median("native", 1) * 1e3 / rollouts,
        "verifiers_env_server_cpu_ms_per_rollout": median("verifiers", 1) * 1e3 / rollouts,
        "native_inference_cpu_ms_per_rollout": median("native", 2) * 1e3 / rollouts,
        "verifiers_inference_cpu_ms_per_rollout": median("verifiers", 2) * 1e3 / rollouts,
    }


def rl_steps(steps: int, quick: bool) -> dict:
    overrides = timing_overrides(steps) + (["orchestrator.batch_size=16"] if quick else [])
    stage(f"rlrun local, native env, {steps} RL steps")
    native = run_local(CONFIG, [*overrides, *NATIVE], "native", env=_environ())
    stage(f"rlrun local, verifiers env, {steps} RL steps")
    vf = run_local(CONFIG, overrides, "verifiers", env=_environ())
    native_step, vf_step = native.median("step_seconds"), vf.median("step_seconds")
    return {
        "rl_steps": steps,
        "rl_batch": f"{16 if quick else load_config(CONFIG).orchestrator.batch_size} x "
        f"{load_config(CONFIG).orchestrator.group_size}",
        "rl_native_step_ms": native_step * 1e3,
        "rl_verifiers_step_ms": vf_step * 1e3,
        "rl_native_gen_ms": native.median("gen_seconds") * 1e3,
        "rl_verifiers_gen_ms": vf.median("gen_seconds") * 1e3,
        "rl_step_ratio": vf_step / native_step,
    }


def main(args: argparse.Namespace) -> int:
    log_dir = Path(os.environ.get("RLRUN_BENCH_DIR", "outputs/bench-verifiers"))
    service = asyncio.run(env_server_steps(2 if args.quick else 10, log_dir))
    local = rl_steps(3 if args.quick else 12, args.quick)
    result = {"benchmark": "verifiers", "quick": args.quick, **service, **local}
    rollouts = result["env_server_rollouts_per_step"]
    print(f"env-server step of {GROUPS} groups x {GROUP_SIZE} rollouts, median:")
    print(f"  native reverse-text:   {result['env_server_native_step_ms']:9.1f} ms")
    print(
        f"  vf:vf_reverse_text:    {result['env_server_verifiers_step_ms']:9.1f} ms "
        f"({result['env_server_step_ratio']:.2f}x; {result['overhead_per_rollout_ms']:.2f} ms more per "
        f"rollout of {rollouts})"
    )
    print(
        "  CPU per rollout, env-server (its workers) / inference (its engine): native "
        f"{result['native_env_server_cpu_ms_per_rollout']:.2f} / {result['native_inference_cpu_ms_per_rollout']:.2f} ms, "
        f"verifiers {result['verifiers_env_server_cpu_ms_per_rollout']:.2f} / "
        f"{result['verifiers_inference_cpu_ms_per_rollout']:.2f} ms"
    )
    print(f"rlrun local RL step ({result['rl_batch']}), median of {result['rl_steps']}:")
    print(
        f"  native {result['rl_native_step_ms']:.0f} ms, verifiers {result['rl_verifiers_step_ms']:.0f} ms: "
        f"{result['rl_step_ratio']:.2f}x (target <= 1.5)"
    )
    return emit_result(result, args)
