"""`rlrun bench stack`: the service stack against the same loop in one process.

Baseline: one process runs the demo's RL loop with the very same components and no
services: the torch inference engine (continuous batching, KV cache), the env's tasks and
scorer, grpo, and the trainer's Learner; weights move by a direct copy. It is synchronous,
as a single-process prototype is. Measured: the `rlrun local` stack on the same config and
number of steps (async, its default). Both skip the warm start and eval, so only RL steps
are timed. The figure is stack time / in-process time (target <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rlrun.bench import emit_result
from rlrun.bench.local_runs import DEMO_CONFIG, run_local, timing_overrides
from rlrun.common.config import load_config
from rlrun.common.service import limit_threads
from rlrun.common.tokenizer import load_tokenizer
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.trace import Channel
from rlrun.common.wire.training import TrainingBatch, TrainingSample
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.sdk.scoring import similarity
from rlrun.inference.engines.torch_engine import create_engine
from rlrun.orchestrator.credit.algorithms.grpo import group_advantages
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner


async def in_process_loop(steps: int) -> float:
    """Seconds for `steps` RL steps of the demo in one process."""
    # The engine on a thread of this process: the baseline has no second process at all.
    config = load_config(DEMO_CONFIG, [*timing_overrides(steps), "inference.engine_process=false"])
    orch = config.orchestrator
    env_cfg = orch.train.env[0]
    env = make_env(env_cfg.id, env_cfg.args)
    tokenizer = load_tokenizer(config.model.tokenizer, config.model.path)
    engine = create_engine(config)
    await engine.start()
    learner = build_learner(config, Parallelism.single())
    sampling = SamplingParams(
        max_tokens=orch.train.sampling.max_completion_tokens,
        temperature=orch.train.sampling.temperature,
        stop_token_ids=tokenizer.stop_token_ids,
        n=orch.group_size,
    )
    header = tokenizer.message_header("assistant")
    std_normalize = orch.algorithm_args.get("grpo", {}).get("std_normalize", False)
    next_idx = 0
    started = time.perf_counter()
    try:
        for step in range(steps):
            tasks = [env.taskset.get("train", next_idx + i) for i in range(orch.batch_size)]
            next_idx += orch.batch_size
            prompts = [tokenizer.render_message("user", t.prompt) + header for t in tasks]
            groups = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            samples = []
            for task, prompt, completions in zip(tasks, prompts, groups, strict=True):
                rewards = [
                    similarity(tokenizer.decode(c.token_ids), task.data["answer"]) for c in completions
                ]
                for completion, advantage in zip(
                    completions, group_advantages(rewards, std_normalize, 1e-6), strict=True
                ):
                    n_prompt, n_done = len(prompt), len(completion.token_ids)
                    samples.append(
                        TrainingSample(
                            token_ids=prompt + completion.token_ids,
                            mask=[False] * n_prompt + [True] * n_done,
                            logprobs=[0.0] * n_prompt + completion.logprobs,
                            temperatures=[sampling.temperature] * (n_prompt + n_done),
                            channels=[Channel("rl", [0.0] * n_prompt + [advantage] * n_done)],
                        )
                    )
            result = learner.train(TrainingBatch(step=step, policy_version=step, samples=samples))
            tensors = {name: t.detach().clone() for name, t in broadcast_tensors(learner.model).items()}
            await engine.update_weights(tensors, result.version)
        return time.perf_counter() - started
    finally:
        await engine.stop()


def main(args: argparse.Namespace) -> int:
    steps = 12 if args.quick else 60
    limit_threads(1)
    baseline_s = asyncio.run(in_process_loop(steps))
    stack = run_local(DEMO_CONFIG, timing_overrides(steps), "stack")
    result = {
        "benchmark": "stack",
        "quick": args.quick,
        "steps": steps,
        "in_process_step_ms": baseline_s / steps * 1e3,
        "stack_step_ms": stack.rl_seconds / stack.steps * 1e3,
        "stack_vs_in_process": stack.rl_seconds / baseline_s,
        "stack_off_policy_lag": stack.median("off_policy_lag"),
    }
    print(
        f"in-process loop {result['in_process_step_ms']:.1f} ms/step, rlrun local stack "
        f"{result['stack_step_ms']:.1f} ms/step: {result['stack_vs_in_process']:.2f}x (target <= 1.5)"
    )
    return emit_result(result, args)
