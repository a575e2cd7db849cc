"""The measurements of `rlrun bench gpu` (rlrun.bench.gpu): each part measures a figure and
its baseline in the same run, on one device.

Every part times whole rounds after a warm-up round, synchronizing the device around each,
and keeps the best round (the least disturbed) or, for the training steps, the median.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rlrun.bench.inference import (
    PROMPT_LEN,
    clients_tok_s,
    grpc_generate,
    random_prompts,
    sampling_generation,
    transformers_model,
)
from rlrun.bench.local_runs import run_local, timing_overrides
from rlrun.bench.trainer import BareLoop
from rlrun.common.config import RunConfig, load_config
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.model import ArchConfig, CausalLM, arch_dict, build_model, create_model
from rlrun.trainer.app import make_broadcaster
from rlrun.trainer.coordinator import Coordinator
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import Learner, build_learner
from rlrun.trainer.synthetic import synthetic_batch
from rlrun.v1 import inference_pb2_grpc


@dataclass
class Setup:
    """What every part measures on: the run file and the overrides that give it the bench's
    model, dtype and device, and the sizes of each part's work."""

    device: str
    run_file: Path
    model_overrides: list[str]
    """The model, its dtype and both devices: every part's, the `rlrun local` run's too."""
    concurrency: int
    tokens: int
    train_samples: int
    train_len: int
    steps: int
    local_overrides: list[str]
    transport: str | None
    """trainer.broadcast.transport of the weight sync; None keeps the run file's (its default)."""
    work_dir: Path

    def config(self, *more: str) -> RunConfig:
        """The run file as the parts but `rlrun local` run it (`service_overrides`), with
        `more` overrides."""
        return load_config(self.run_file, [*self.service_overrides(), *more])

    def service_overrides(self) -> list[str]:
        """The bench's model, and room for the longest sequence and the most rows of the parts
        that do not run `rlrun local`."""
        longest = max(PROMPT_LEN + self.tokens, self.train_len)
        return [
            *self.model_overrides,
            f"model.max_model_len={longest}",
            f"inference.max_batch_size={self.concurrency}",
        ]

    def transport_overrides(self) -> list[str]:
        """The weight sync's transport, where `--transport` names one."""
        return [] if self.transport is None else [f'trainer.broadcast.transport="{self.transport}"']

    @property
    def vocab_size(self) -> int:
        return ArchConfig.from_dict(arch_dict(self.config().model)).vocab_size


class Rounds:
    """When a part stops measuring: after its first round, once its share of the time is
    spent or it has measured `most` rounds."""

    def __init__(self, seconds: float, most: int):
        self.end = time.perf_counter() + seconds
        self.most = most

    def more(self, done: int) -> bool:
        return done == 0 or (done < self.most and time.perf_counter() < self.end)


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def free_device_memory(device: str) -> None:
    """Hands the cached blocks of what the last part built back to the device (the next part
    and `rlrun local`'s services need them)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# -- the served engine and its baselines -----------------------------------------------------


async def served_tok_s(setup: Setup, address: str, rounds: Rounds) -> float:
    """Generated tok/s of `concurrency` concurrent Generate calls of `tokens` tokens each to the
    service at `address`; the best round after a warm-up round."""
    vocab = setup.vocab_size
    async with open_channel(address, ClientOptions(deadline_s=600)) as channel:
        generate = grpc_generate(
            inference_pb2_grpc.InferenceServiceStub(channel).Generate, max_tokens=setup.tokens
        )
        await clients_tok_s(generate, vocab, 1, setup.concurrency)  # warm-up
        figures: list[float] = []
        while rounds.more(len(figures)):
            figures.append(await clients_tok_s(generate, vocab, 1, setup.concurrency))
    return max(figures)


def generate_tok_s(setup: Setup, rounds: Rounds) -> float:
    """transformers `generate` (its defaults: a dynamic cache, eager) of the same number of
    prompts in one batch, `tokens` sampled tokens each."""
    config = setup.config()
    hf = transformers_model(config, setup.device)
    prompts = torch.tensor(random_prompts(setup.concurrency, setup.vocab_size, 1), device=setup.device)
    attention_mask = torch.ones_like(prompts)
    generation = sampling_generation(setup.tokens)
    times: list[float] = []
    with torch.inference_mode():
        hf.generate(prompts, attention_mask=attention_mask, generation_config=sampling_generation(4))
        while rounds.more(len(times)):
            synchronize(setup.device)
            started = time.perf_counter()
            output = hf.generate(prompts, attention_mask=attention_mask, generation_config=generation)
            synchronize(setup.device)
            times.append(time.perf_counter() - started)
            if output.shape[1] != PROMPT_LEN + setup.tokens:
                raise RuntimeError(
                    f"generate returned {output.shape[1] - PROMPT_LEN} tokens, not {setup.tokens}"
                )
    del hf
    free_device_memory(setup.device)
    return setup.concurrency * setup.tokens / min(times)


class StaticDecode:
    """Attention of one decode step of every row at one position (a device tensor), over a
    static K/V cache [rows, kv_heads, max_len, head_dim]: no shape or value depends on the
    step, so a CUDA graph can capture it. A kv head's query heads attend together as a
    query of `groups` tokens (grouped-query attention without copying the cache)."""

    def __init__(self, model: CausalLM, rows: int, max_len: int):
        cfg = model.config
        weight = model.lm_head.weight
        # CUDA's memory-efficient attention pads a mask whose last dimension is not a multiple
        # of 16, a copy per layer and step; positions past the last one are never visible.
        max_len = -(-max_len // 16) * 16
        shape = (rows, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [weight.new_zeros(shape) for _ in range(cfg.num_layers)]
        self.v = [weight.new_zeros(shape) for _ in range(cfg.num_layers)]
        self.position = torch.zeros(1, dtype=torch.long, device=weight.device)
        self.span = torch.arange(max_len, device=weight.device)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [rows, heads, D]; k, v: [rows, kv_heads, D]
        keys, values = self.k[layer], self.v[layer]
        keys.index_copy_(2, self.position, k[:, :, None, :])
        values.index_copy_(2, self.position, v[:, :, None, :])
        rows, heads, dim = q.shape
        queries = q.reshape(rows, k.shape[1], heads // k.shape[1], dim)
        visible = (self.span <= self.position)[None, None, None, :]
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible).reshape(
            rows, heads, dim
        )


class DecodeLoop:
    """The limit's decode loop: every row in lockstep over a static cache, one step = the
    forward of each row's last token, argmax into `tokens`, the position advanced. The
    prompts [rows, length] go in one token a step when it is built; on CUDA the step is
    then captured in a graph and `replay` replays it, elsewhere `replay` runs it."""

    def __init__(self, model: CausalLM, prompts: torch.Tensor, max_tokens: int):
        self.model = model
        self.rows, self.prompt_len = prompts.shape
        self.attend = StaticDecode(model, self.rows, self.prompt_len + max_tokens)
        self.tokens = prompts[:, 0].clone()
        for index in range(self.prompt_len):
            self.tokens.copy_(prompts[:, index])
            self.attend.position.fill_(index)
            self.step()
        self.first = self.tokens.clone()
        """Each row's first generated token (of its prompt's last step)."""
        self.replay = capture(self.step) if prompts.device.type == "cuda" else self.step

    def step(self) -> None:
        positions = self.attend.position.expand(self.rows)
        hidden = self.model.hidden_states(self.tokens, positions, self.attend)
        self.tokens.copy_(self.model.lm_head(hidden).argmax(dim=-1))
        self.attend.position.add_(1)

    def restart(self) -> None:
        """Back to just after the prompts: `tokens` holds `first` again."""
        self.tokens.copy_(self.first)
        self.attend.position.fill_(self.prompt_len)


def graph_limit_tok_s(setup: Setup, rounds: Rounds) -> float:
    """The limit of a decode loop on this model: `concurrency` rows in lockstep, a static
    cache, the whole decode step (forward, argmax, position) captured in one CUDA graph and
    replayed `tokens` times; eager on a CPU. The prompt goes in untimed."""
    times = graph_decode_times(setup, rounds)
    free_device_memory(setup.device)  # the model, its cache and the graph's pool are gone
    return setup.concurrency * setup.tokens / min(times)


def graph_decode_times(setup: Setup, rounds: Rounds) -> list[float]:
    """`graph_limit_tok_s`'s rounds: seconds of `tokens` decode steps each."""
    model = build_model(setup.config().model, device=setup.device).eval()
    prompts = torch.tensor(random_prompts(setup.concurrency, setup.vocab_size, 2), device=setup.device)
    times: list[float] = []
    with torch.inference_mode():
        loop = DecodeLoop(model, prompts, setup.tokens)

        def decode_round() -> float:
            loop.restart()
            synchronize(setup.device)
            started = time.perf_counter()
            for _ in range(setup.tokens):
                loop.replay()
            loop.tokens.tolist()
            return time.perf_counter() - started

        decode_round()  # warm-up
        while rounds.more(len(times)):
            times.append(decode_round())
    return times


def capture(step: Callable[[], object]) -> Callable[[], None]:
    """`step` captured in a CUDA graph, after the warm-up on a side stream that capture needs
    (three runs of `step`: its buffers are to be reset before a replay); returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


# -- the learner -----------------------------------------------------------------------------


def learner_vs_bare(setup: Setup, rounds: Rounds) -> tuple[Learner, dict]:
    """The trainer's Learner step against a bare loop (forward, advantage-weighted NLL,
    backward, AdamW) on the same packed batch of `train_samples` x `train_len` tokens, one
    micro-batch, one optimizer step each; turns alternate and each figure is the median.
    Returns the learner too: the weight sync sends its weights."""
    tokens = setup.train_samples * setup.train_len
    config = setup.config(f"trainer.micro_batch_tokens={tokens}", "trainer.grad_steps_per_batch=1")
    prompt = setup.train_len // 8
    batch = synthetic_batch(
        0,
        num_samples=setup.train_samples,
        vocab_size=setup.vocab_size,
        prompt_len=(prompt, prompt),
        completion_len=(setup.train_len - prompt, setup.train_len - prompt),
    )
    bare = BareLoop(config, batch)
    learner = build_learner(config, Parallelism.single(setup.device))
    bare_s: list[float] = []
    learner_s: list[float] = []

    def timed(run) -> float:
        synchronize(setup.device)
        started = time.perf_counter()
        run()
        synchronize(setup.device)
        return time.perf_counter() - started

    def learner_step() -> None:
        batch.step = learner.step
        if learner.train(batch).skipped:
            raise RuntimeError("the learner skipped the benchmark's batch (a non-finite loss)")

    for _ in range(2):  # warm-up
        timed(bare.step)
        timed(learner_step)
    while rounds.more(len(bare_s)):
        bare_s.append(timed(bare.step))
        learner_s.append(timed(learner_step))
    del bare
    free_device_memory(setup.device)
    return learner, {
        "train_tokens": tokens,
        "bare_tok_s": tokens / statistics.median(bare_s),
        "learner_tok_s": tokens / statistics.median(learner_s),
    }


# -- the weight sync -------------------------------------------------------------------------


async def weight_sync(setup: Setup, address: str, learner: Learner | None, rounds: Rounds) -> dict:
    """The trainer's weight sync as its runtime does one (gather the learner's weights,
    broadcast them with the broadcaster `trainer.broadcast.transport` names) to the service
    at `address`; the best round after a warm-up round, in GB/s of the weights' bytes. Without
    `learner` (its part skipped) it builds one."""
    config = setup.config(f'inference.addresses=["{address}"]', *setup.transport_overrides())
    if learner is None:
        learner = build_learner(config, Parallelism.single(setup.device))
    broadcaster = make_broadcaster(config, ClientOptions())
    coordinator = Coordinator(learner, None)
    times: list[float] = []

    async def sync(version: int) -> tuple[float, int]:
        started = time.perf_counter()
        tensors = await asyncio.to_thread(coordinator.gather_weights, broadcaster.tensors_on_cpu)
        [result] = await broadcaster.broadcast(tensors, version)
        if not result.ok:
            raise RuntimeError(f"the weight sync to {address} failed: {result.error}")
        return time.perf_counter() - started, result.bytes

    try:
        await sync(1)  # warm-up
        while rounds.more(len(times)):
            seconds, synced = await sync(len(times) + 2)
            times.append(seconds)
    finally:
        await broadcaster.close()
    return {
        "transport": config.trainer.broadcast.transport,
        "sync_bytes": synced,
        "sync_gb_s": synced / min(times) / 1e9,
        "copy_gb_s": device_copy_gb_s(synced, setup.device),
    }


def device_copy_gb_s(size: int, device: str, repeats: int = 5) -> float:
    """GB/s of copying `size` bytes from one buffer to another on `device`: the fastest of
    `repeats` copies after a first that warms up."""
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return size / best / 1e9


# -- rlrun local -----------------------------------------------------------------------------


def local_figures(setup: Setup) -> dict:
    """`rlrun local` on the run file with the bench's model for `steps` RL steps (no warm
    start, eval or checkpoints): seconds per RL step and generated tok/s from its
    metrics.jsonl, leaving out the first step (it pays the first compilations and captures)
    when there are more."""
    run = run_local(
        setup.run_file,
        [*setup.model_overrides, *timing_overrides(setup.steps), *setup.local_overrides],
        "gpu-local",
    )
    rows = run.rl_rows[1:] or run.rl_rows
    seconds = [row["step_seconds"] for row in rows]
    return {
        "local_steps": len(rows),
        "local_s_per_step": statistics.median(seconds),
        "local_tok_s": sum(row["tokens"] for row in rows) / sum(seconds),
        "local_tokens_per_step": statistics.mean(row["tokens"] for row in rows),
    }


def write_model_config(preset: Path, fields: dict, work_dir: Path) -> Path:
    """The preset's transformers config with `fields` replaced, written to `work_dir`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "model.json"
    path.write_text(json.dumps({**json.loads(preset.read_text()), **fields}, indent=2))
    return path.resolve()


def parameter_count(setup: Setup) -> int:
    """The bench model's parameters, counted without building its weights."""
    with torch.device("meta"):
        model = create_model(ArchConfig.from_dict(arch_dict(setup.config().model)))
    return sum(p.numel() for p in model.parameters())
