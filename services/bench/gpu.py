"""`rlrun bench gpu`: what makes an RL step fast on one GPU, each part against a baseline
measured in the same run (docs/gpu.md):

- served: the torch engine as `rlrun serve inference` serves it (the engine's defaults for
  the device) under `--concurrency` concurrent gRPC Generate calls of `--tokens` tokens, vs
  transformers `generate` of as many prompts in one batch (`served_vs_generate`, target >= 3
  on the 385M model at 128 requests), and vs the limit: a raw decode loop of the same model,
  a static KV cache and argmax, its step captured in a CUDA graph (`served_vs_graph_limit`);
- learner: the trainer's Learner step vs a bare training loop on the same packed batch
  (`learner_vs_bare`, target >= 0.9);
- sync: the trainer's weight sync (its broadcaster factory, `--transport`) into the served
  engine, in GB/s, vs a copy of the same bytes from one buffer to another on the device
  (`sync_vs_copy`; target: the sync >= 10 GB/s);
- local: `rlrun local` on configs/gpu/reverse_text_0.4b.toml with the bench's model: seconds
  per RL step and generated tok/s, against the figures measured before the fast paths
  (3.1-4.6 s a step, 785 tok/s, one H200; target: 5x faster than 3.1 s).

The model is a preset's transformers config (`--model`) with any of its sizes replaced by
flags, so a short lease can run a smaller one. Without CUDA, or with `--cpu`, it is the CPU
fallback: every part on the CPU with the tiny preset and small counts, which shows that the
bench runs, not how fast a GPU is. Each part but `rlrun local` (whose length is `--steps`)
measures for its share of `--budget` seconds at most, one round at least after its warm-up.
The last stdout line is JSON.

This module imports nothing heavy at the top: `rlrun` builds its parser from it on every call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from rlrun.bench import emit_result, stage
from rlrun.common.arguments import positive

RUN_FILE = Path("configs/gpu/reverse_text_0.4b.toml")
PRESETS = {"385m": Path("configs/gpu/qwen3-385m.json"), "tiny": Path("configs/models/tiny-d128.json")}
ARCH_FLAGS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
}
"""Flags that replace a field of the preset's transformers config."""
PARTS = ("served", "generate", "graph", "learner", "sync", "local")
SHARES = {"served": 0.12, "generate": 0.08, "graph": 0.04, "learner": 0.08, "sync": 0.06}
"""Each part's share of --budget; the rest is for starting services and `rlrun local`."""
REFERENCE_S_PER_STEP = (3.1, 4.6)
REFERENCE_TOK_S = 785.0
"""`rlrun local` on the 0.4B model before the fast paths (one H200, torch 2.11+cu130)."""
TARGETS = {
    "served_vs_generate": 3.0,
    "learner_vs_bare": 0.9,
    "sync_gb_s": 10.0,
    "local_speedup_vs_reference": 5.0,
}
RATIOS = {
    "served_vs_generate": ("served_tok_s", "generate_tok_s"),
    "served_vs_graph_limit": ("served_tok_s", "graph_limit_tok_s"),
    "learner_vs_bare": ("learner_tok_s", "bare_tok_s"),
    "sync_vs_copy": ("sync_gb_s", "copy_gb_s"),
}
"""Each ratio: (the measured figure, its baseline), both from this run."""
SIZES = {
    "concurrency": "concurrent Generate requests, the batch of generate and of the graph loop",
    "tokens": "tokens generated per request",
    "train_samples": "samples of the training batch",
    "train_len": "tokens of each training sample",
    "steps": "RL steps of the rlrun local run",
}
"""Flags that replace a default of the device's Scale."""


@dataclass(frozen=True)
class Scale:
    """The defaults of a device kind."""

    model: str
    dtype: str
    concurrency: int
    tokens: int
    train_samples: int
    train_len: int
    steps: int
    budget_s: float
    local_overrides: tuple[str, ...] = ()


GPU = Scale("385m", "bfloat16", 128, 256, 32, 512, 8, 240.0)
CPU = Scale("tiny", "float32", 8, 16, 4, 64, 2, 60.0, ("orchestrator.batch_size=8",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpu", action="store_true", help="the CPU fallback even where CUDA is available (tiny model)"
    )
    parser.add_argument(
        "--device", help="torch device (default: cuda where available, else the CPU fallback)"
    )
    parser.add_argument(
        "--model",
        choices=sorted(PRESETS),
        help=f"model preset, a transformers config (default: {GPU.model}; {CPU.model} on a CPU)",
    )
    for flag, field in ARCH_FLAGS.items():
        parser.add_argument(
            f"--{flag.replace('_', '-')}", type=positive, metavar="N", help=f"replace the preset's {field}"
        )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help=f"model dtype (default: {GPU.dtype}; {CPU.dtype} on a CPU)",
    )
    for name, what in SIZES.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=positive,
            metavar="N",
            help=f"{what} (default: {getattr(GPU, name)}; {getattr(CPU, name)} on a CPU)",
        )
    parser.add_argument(
        "--transport",
        help="trainer.broadcast.transport of the weight sync, e.g. grpc (default: the trainer's default)",
    )
    parser.add_argument(
        "--skip", action="append", choices=PARTS, default=[], help="leave a part out (repeatable)"
    )
    parser.add_argument(
        "--budget",
        type=positive,
        metavar="SECONDS",
        help=f"time the whole bench aims at (default: {GPU.budget_s:.0f}; {CPU.budget_s:.0f} on a CPU)",
    )


@dataclass
class Plan:
    """The options resolved against the device's defaults."""

    device: str
    fallback: bool
    scale: Scale
    preset: str
    arch: dict
    """Fields of the preset's transformers config that flags replace."""
    dtype: str
    parts: list[str]
    budget_s: float
    most_rounds: int


def usage_error(message: str) -> NoReturn:
    print(f"rlrun bench gpu: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def plan(args: argparse.Namespace, cuda: bool) -> Plan:
    """The options against the defaults of the device: the CPU fallback's with --cpu, with
    --device cpu, or with neither --device nor CUDA."""
    if args.cpu and args.device not in (None, "cpu"):
        usage_error(f"--cpu runs on the CPU; --device {args.device} contradicts it")
    device = args.device or ("cuda" if cuda and not args.cpu else "cpu")
    fallback = device == "cpu"
    sizes = {name: getattr(args, name) for name in SIZES if getattr(args, name) is not None}
    scale = replace(CPU if fallback else GPU, **sizes)
    return Plan(
        device=device,
        fallback=fallback,
        scale=scale,
        preset=args.model or scale.model,
        arch={
            field: getattr(args, flag)
            for flag, field in ARCH_FLAGS.items()
            if getattr(args, flag) is not None
        },
        dtype=args.dtype or scale.dtype,
        parts=[part for part in PARTS if part not in args.skip],
        budget_s=float(args.budget or scale.budget_s),
        most_rounds=1 if args.quick else 5,
    )


ROWS = (
    ("served", "served_tok_s", "tok/s", "transformers generate", "generate_tok_s", "served_vs_generate"),
    (
        "served",
        "served_tok_s",
        "tok/s",
        "CUDA-graph decode loop",
        "graph_limit_tok_s",
        "served_vs_graph_limit",
    ),
    ("learner", "learner_tok_s", "tok/s", "bare training loop", "bare_tok_s", "learner_vs_bare"),
    ("sync", "sync_gb_s", "GB/s", "device copy", "copy_gb_s", "sync_vs_copy"),
)
"""The table: part, measured figure, unit, baseline, its figure, ratio."""
CONFIG_FLAGS = {
    "trainer.broadcast.transport": "--transport",
    "model.dtype": "--dtype",
    "inference.device": "--device",
    "trainer.device": "--device",
}
"""The flag that sets a config key."""


def setup_for(plan: Plan, work_dir: Path, transport: str | None):
    """The parts' Setup and the model's parameter count, its model config written to
    `work_dir`; a flag the run cannot take is a usage error that names it."""
    from rlrun.bench import gpu_parts
    from rlrun.common.config import ConfigError

    model_json = gpu_parts.write_model_config(PRESETS[plan.preset], plan.arch, work_dir)
    arch = json.loads(model_json.read_text())
    heads, kv_heads = arch["num_attention_heads"], arch["num_key_value_heads"]
    if heads % kv_heads:
        usage_error(f"--kv-heads {kv_heads} does not divide the {heads} attention heads (--heads)")
    scale = plan.scale
    setup = gpu_parts.Setup(
        device=plan.device,
        run_file=RUN_FILE,
        model_overrides=[
            f'model.config="{model_json}"',
            f'model.dtype="{plan.dtype}"',
            f'inference.device="{plan.device}"',
            f'trainer.device="{plan.device}"',
        ],
        concurrency=scale.concurrency,
        tokens=scale.tokens,
        train_samples=scale.train_samples,
        train_len=scale.train_len,
        steps=scale.steps,
        local_overrides=list(scale.local_overrides),
        transport=transport,
        work_dir=work_dir,
    )
    try:
        setup.config(*setup.transport_overrides())
        parameters = gpu_parts.parameter_count(setup)
    except ConfigError as error:
        usage_error(f"{error} ({CONFIG_FLAGS.get(error.path, 'the model flags')})")
    except ValueError as error:
        usage_error(f"the model: {error}")
    return setup, parameters


async def measure(plan: Plan, setup) -> dict:
    """The parts in `plan.parts`, in an order that starts the inference service once."""
    from rlrun.bench import gpu_parts
    from rlrun.bench.services import served

    def rounds(part: str):
        return gpu_parts.Rounds(SHARES[part] * plan.budget_s, plan.most_rounds)

    figures: dict = {}
    learner = None
    if "learner" in plan.parts:
        stage(f"learner: {setup.train_samples} x {setup.train_len} tokens, the trainer's step vs a bare loop")
        learner, found = gpu_parts.learner_vs_bare(setup, rounds("learner"))
        figures.update(found)
    if {"served", "sync"} & set(plan.parts):
        stage("starting the served engine (rlrun serve inference)")
        async with served(
            "inference", setup.run_file, setup.work_dir / "inference", overrides=setup.service_overrides()
        ) as address:
            if "served" in plan.parts:
                stage(f"served: {setup.concurrency} concurrent Generate calls of {setup.tokens} tokens")
                figures["served_tok_s"] = await gpu_parts.served_tok_s(setup, address, rounds("served"))
            if "sync" in plan.parts:
                stage("sync: the trainer's weight sync into the served engine, and a device copy")
                figures.update(await gpu_parts.weight_sync(setup, address, learner, rounds("sync")))
    del learner
    gpu_parts.free_device_memory(setup.device)
    if "generate" in plan.parts:
        stage(f"generate: transformers generate, {setup.concurrency} prompts in one batch")
        figures["generate_tok_s"] = gpu_parts.generate_tok_s(setup, rounds("generate"))
    if "graph" in plan.parts:
        stage(f"graph: a raw decode loop of {setup.concurrency} rows, its step in a CUDA graph")
        figures["graph_limit_tok_s"] = gpu_parts.graph_limit_tok_s(setup, rounds("graph"))
    if "local" in plan.parts:
        stage(f"local: rlrun local on {setup.run_file}, {setup.steps} RL steps")
        figures.update(gpu_parts.local_figures(setup))
    return figures


def ratios(figures: dict) -> dict:
    """Each ratio of RATIOS whose two figures were measured, and `rlrun local`'s speed-up
    over the faster end of the reference."""
    found = {
        name: figures[a] / figures[b] for name, (a, b) in RATIOS.items() if a in figures and b in figures
    }
    if "local_s_per_step" in figures:
        found["local_speedup_vs_reference"] = min(REFERENCE_S_PER_STEP) / figures["local_s_per_step"]
    return found


def report(result: dict) -> None:
    """The table of each measured figure against its baseline."""
    print(
        f"rlrun bench gpu on {result['device']} ({'CPU fallback, ' if result['fallback'] else ''}"
        f"{result['model']['parameters'] / 1e6:.1f}M-parameter {result['model']['preset']} model, {result['dtype']})"
    )
    print(f"{'part':<8} {'measured':>16}   {'baseline (this run)':<24} {'figure':>14} {'ratio':>7}  target")
    for part, measured, unit, baseline, figure, ratio in ROWS:
        if ratio in result:
            target = TARGETS.get(ratio)
            if result["fallback"]:  # no capture on a CPU
                baseline = baseline.replace("CUDA-graph", "eager")
            print(
                f"{part:<8} {result[measured]:>10.2f} {unit:<5}   {baseline:<24} {result[figure]:>8.2f} {unit:<5} "
                f"{result[ratio]:>7.3f}  {f'>= {target}' if target else ''}"
            )
    if "sync_gb_s" in result:
        print(
            f"         weight sync over {result['transport']}: {result['sync_bytes'] / 1e6:.1f} MB (target >= 10 GB/s)"
        )
    if "local_s_per_step" in result:
        low, high = REFERENCE_S_PER_STEP
        print(
            f"local    {result['local_s_per_step']:>10.3f} s/step, {result['local_tok_s']:.0f} tok/s "
            f"({result['local_tokens_per_step']:.0f} generated tokens a step) vs {low}-{high} s/step, "
            f"{REFERENCE_TOK_S:.0f} tok/s before: {result['local_speedup_vs_reference']:.2f}x (target >= 5)"
        )
    print(f"elapsed {result['elapsed_s']:.1f} s")


def main(args: argparse.Namespace) -> int:
    import torch

    started = time.perf_counter()
    resolved = plan(args, torch.cuda.is_available())
    if resolved.fallback:
        torch.set_num_threads(1)
    work_dir = Path(os.environ.get("RLRUN_BENCH_DIR", "outputs/bench-gpu"))
    setup, parameters = setup_for(resolved, work_dir, args.transport)
    figures = asyncio.run(measure(resolved, setup))
    found = ratios(figures)
    for name, value in found.items():
        if not (math.isfinite(value) and value > 0):
            raise RuntimeError(f"rlrun bench gpu: {name} came out {value}: {figures}")
    scale = resolved.scale
    result = {
        "bench": "gpu",
        "device": torch.cuda.get_device_name(resolved.device)
        if resolved.device.startswith("cuda")
        else "cpu",
        "torch": torch.__version__,
        "fallback": resolved.fallback,
        "quick": args.quick,
        "model": {"preset": resolved.preset, **resolved.arch, "parameters": parameters},
        "dtype": resolved.dtype,
        "concurrency": scale.concurrency,
        "tokens": scale.tokens,
        "train_samples": scale.train_samples,
        "train_len": scale.train_len,
        "steps": scale.steps,
        "skipped": sorted(set(PARTS) - set(resolved.parts)),
        **figures,
        **found,
        "ratios": {name: list(pair) for name, pair in RATIOS.items() if name in found},
        "reference": {"local_s_per_step": list(REFERENCE_S_PER_STEP), "local_tok_s": REFERENCE_TOK_S},
        "targets": TARGETS,
        "budget_s": resolved.budget_s,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    report(result)
    return emit_result(result, args)
