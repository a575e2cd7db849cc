"""`rlrun bench orchestrator`: what the orchestrator's batch building costs.

1. Throughput on 256-token traces (a 32-token prompt and 224 sampled tokens), in batches of 16
   groups x 8: (b) the orchestrator's pipeline, i.e. the grpo algorithm (std-normalised), both
   rollout filters (monitoring), flattening with the shared-node and trainable-token masks,
   the batch metrics, and the TrainingBatch proto, against (a) a bare baseline measured in the
   same run that only copies each trace's tokens, mask and logprobs into a TrainingSample
   proto with a constant advantage. `traces_per_s` is (b); the target is >= 5,000/s.
   `ratio_vs_bare` = (b) / (a) in traces/s. The two alternate; figures are medians.
2. Share of the demo's step time (`share_of_step`, target <= 5%): the pipeline's time for a
   demo-shaped batch (configs/reverse_text.toml's prompts x samples of reverse-text traces, ~12
   prompt and 10 completion tokens) divided by a demo step time, taken from, in order:
   - a demo run's metrics.jsonl given by `--demo-metrics PATH` (when run as
     `python -m rlrun.bench.orchestrator`) or the RLRUN_BENCH_DEMO_METRICS environment variable:
     the median `step_seconds` of its RL steps (the share the demo recorded itself, its median
     `batch_build_seconds` over that, is reported too as `recorded_share_of_step`);
   - else outputs/reverse_text/metrics.jsonl (the demo's default output), when it exists;
   - else a measured lower bound: the trainer's compute alone for that batch on the demo model
     (forward + backward + AdamW, `grad_steps_per_batch` times, one torch thread).
     A real step also generates, so the share it gives is an upper bound.

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from rlrun.bench import emit_result
from rlrun.bench.local_runs import DEMO_CONFIG
from rlrun.common.config import FiltersConfig, load_config
from rlrun.common.wire.trace import Branch, MessageNode, TaskRef, Trace
from rlrun.common.wire.training import sample_to_proto
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.credit.algorithms import AlgorithmDeps, builtin
from rlrun.orchestrator.credit.batching import build_batch
from rlrun.orchestrator.credit.filters import RolloutFilters
from rlrun.v1 import trace_pb2, training_pb2

DEFAULT_DEMO_METRICS = Path("outputs/reverse_text/metrics.jsonl")
VOCAB = 128


def make_groups(
    rng: random.Random, groups: int, group_size: int, prompt: int, completion: int
) -> list[RolloutGroup]:
    out = []
    for g in range(groups):
        traces = []
        for i in range(group_size):
            nodes = [
                MessageNode("u", "user", [rng.randrange(6, VOCAB) for _ in range(prompt)], [False] * prompt),
                MessageNode(
                    "a",
                    "assistant",
                    [rng.randrange(6, VOCAB) for _ in range(completion)],
                    [True] * completion,
                    [-rng.uniform(0.05, 3.0) for _ in range(completion)],
                    parent="u",
                ),
            ]
            traces.append(
                Trace(
                    id=f"g{g}/{i}",
                    task=TaskRef("bench", "train", g),
                    nodes=nodes,
                    branches=[Branch(["u", "a"])],
                    reward=rng.random(),
                )
            )
        out.append(
            RolloutGroup(
                f"g{g}",
                "bench",
                TaskRef("bench", "train", g),
                traces,
                0,
                frozenset({"policy"}),
                {"policy": 1.0},
            )
        )
    return out


def reset(groups: list[RolloutGroup]) -> None:
    for group in groups:
        for trace in group.traces:
            for branch in trace.branches:
                branch.channels, branch.mask = [], []


class Pipeline:
    """The orchestrator's own path from finished groups to the TrainingBatch proto."""

    def __init__(self) -> None:
        self.grpo = builtin("grpo")({"std_normalize": True}, AlgorithmDeps())
        filters = FiltersConfig.model_validate(
            {
                "gibberish": {"enabled": True, "enforce": False, "token_id_above": 100},
                "repetition": {"enabled": True, "enforce": False},
            }
        )
        self.filters = RolloutFilters(filters, VOCAB)

    def __call__(self, groups: list[RolloutGroup]) -> training_pb2.TrainingBatch:
        for group in groups:
            self.grpo.credit(group)
        batch = build_batch(groups, self.filters)
        return training_pb2.TrainingBatch(
            samples=[sample_to_proto(s) for s in batch.samples], metrics=batch.metrics
        )


def bare(groups: list[RolloutGroup]) -> training_pb2.TrainingBatch:
    """The least any implementation must do: copy each trace into a sample."""
    samples = []
    for group in groups:
        for trace in group.traces:
            ids: list[int] = []
            mask: list[bool] = []
            logprobs: list[float] = []
            for node in trace.nodes:
                sampled = iter(node.logprobs)
                ids += node.token_ids
                mask += node.sampled_mask
                logprobs += [next(sampled) if s else 0.0 for s in node.sampled_mask]
            channel = trace_pb2.AdvantageChannel(
                loss=trace_pb2.LOSS_TYPE_RL, values=[trace.reward] * len(ids)
            )
            samples.append(
                training_pb2.TrainingSample(
                    token_ids=ids,
                    mask=mask,
                    logprobs=logprobs,
                    temperatures=[1.0] * len(ids),
                    channels=[channel],
                )
            )
    return training_pb2.TrainingBatch(samples=samples)


def timed(fn, groups) -> float:
    reset(groups)
    started = time.perf_counter()
    fn(groups)
    return time.perf_counter() - started


def measure_throughput(batches: int) -> dict:
    rng = random.Random(0)
    data = [make_groups(rng, 16, 8, 32, 224) for _ in range(3)]
    pipeline = Pipeline()
    ours, base = [], []
    for i in range(batches):
        groups = data[i % len(data)]
        ours.append(timed(pipeline, groups))
        base.append(timed(bare, groups))
    traces = 16 * 8
    ours_s, base_s = statistics.median(ours), statistics.median(base)
    return {
        "traces_per_s": traces / ours_s,
        "bare_traces_per_s": traces / base_s,
        "ratio_vs_bare": base_s / ours_s,
        "batch_ms_256_tokens": 1000 * ours_s,
    }


def demo_shape() -> dict:
    config = load_config(DEMO_CONFIG)
    orch = config.orchestrator
    return {
        "batch_size": orch.batch_size,
        "group_size": orch.group_size,
        "completion": min(10, orch.train.sampling.max_completion_tokens),
        "grad_steps": config.trainer.grad_steps_per_batch,
        "model": config.model,
    }


def measure_demo_build(shape: dict, batches: int) -> float:
    groups = make_groups(random.Random(1), shape["batch_size"], shape["group_size"], 12, shape["completion"])
    pipeline = Pipeline()
    return statistics.median(timed(pipeline, groups) for _ in range(batches))


def rl_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("phase") == "rl" and r.get("step_seconds")]
    if not steps:
        raise SystemExit(f"{path} has no RL steps with step_seconds")
    return steps


def recorded_share(path: Path) -> float:
    """The share the demo recorded itself: its median batch_build_seconds over its median step_seconds."""
    rows = rl_rows(path)
    build = statistics.median(r["batch_build_seconds"] for r in rows)
    return build / statistics.median(r["step_seconds"] for r in rows)


def train_step_lower_bound(shape: dict, iterations: int) -> float:
    """The trainer's compute alone for one demo batch: forward + backward + AdamW, grad_steps times."""
    import torch

    from rlrun.common.model import PackedCausal, build_model

    torch.set_num_threads(1)
    model = build_model(shape["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples, length = shape["batch_size"] * shape["group_size"], 12 + shape["completion"]
    # Token ids the demo model has: its vocabulary is the char tokenizer's, a few dozen ids
    # (a fixed bound of 100 indexed past it on a fresh clone, where this path runs).
    ids = torch.randint(0, model.config.vocab_size, (samples * length,))
    positions = torch.arange(length).repeat(samples)
    attend = PackedCausal([length] * samples)
    advantages = torch.randn(samples * length - 1)

    def step() -> None:
        for _ in range(shape["grad_steps"]):
            logits = model(ids, positions, attend)
            logprobs = torch.log_softmax(logits[:-1].float(), dim=-1).gather(1, ids[1:, None]).squeeze(1)
            loss = -(logprobs * advantages).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    step()  # warm-up
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def demo_metrics_file(given: Path | None) -> Path | None:
    if given is None and os.environ.get("RLRUN_BENCH_DEMO_METRICS"):
        given = Path(os.environ["RLRUN_BENCH_DEMO_METRICS"])
    if given is None and DEFAULT_DEMO_METRICS.exists():
        given = DEFAULT_DEMO_METRICS
    return given


def demo_step_time(shape: dict, metrics_file: Path | None, quick: bool) -> tuple[float, str]:
    if metrics_file is not None:
        seconds = statistics.median(r["step_seconds"] for r in rl_rows(metrics_file))
        return seconds, f"median RL step_seconds of {metrics_file}"
    seconds = train_step_lower_bound(shape, 3 if quick else 15)
    return (
        seconds,
        "measured lower bound: trainer compute alone (demo model forward+backward+AdamW x grad_steps)",
    )


def main(args: argparse.Namespace) -> int:
    quick = bool(args.quick)
    throughput = measure_throughput(6 if quick else 40)
    shape = demo_shape()
    build_s = measure_demo_build(shape, 10 if quick else 60)
    metrics_file = demo_metrics_file(getattr(args, "demo_metrics", None))
    step_s, source = demo_step_time(shape, metrics_file, quick)
    result = {
        "benchmark": "orchestrator",
        "quick": quick,
        **throughput,
        "demo_batch_build_ms": 1000 * build_s,
        "demo_step_ms": 1000 * step_s,
        "demo_step_source": source,
        "share_of_step": build_s / step_s,
    }
    if metrics_file is not None:
        result["recorded_share_of_step"] = recorded_share(metrics_file)
    print("256-token traces, batches of 16 x 8 (grpo, filters, flattening, batch metrics, proto):")
    print(
        f"  (b) orchestrator pipeline: {result['traces_per_s']:9.0f} traces/s "
        f"({result['batch_ms_256_tokens']:.1f} ms/batch; target >= 5000)"
    )
    print(f"  (a) bare copy baseline:    {result['bare_traces_per_s']:9.0f} traces/s")
    print(f"  b/a = {result['ratio_vs_bare']:.3f}")
    print(
        f"demo batch ({shape['batch_size']} x {shape['group_size']}): build {result['demo_batch_build_ms']:.2f} ms "
        f"vs step {result['demo_step_ms']:.1f} ms ({source})"
    )
    print(f"  share of step = {result['share_of_step']:.2%} (target <= 5%)")
    if metrics_file is not None:
        print(
            f"  as the demo recorded it (batch_build_seconds / step_seconds): {result['recorded_share_of_step']:.2%}"
        )
    return emit_result(result, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m rlrun.bench.orchestrator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--output", type=Path, help="also write the JSON result to this file")
    parser.add_argument(
        "--demo-metrics", type=Path, help="a demo run's metrics.jsonl to take the step time from"
    )
    raise SystemExit(main(parser.parse_args()))
