"""Context parallelism: two CPU ranks over gloo, each holding half of every packed sequence
and attending by ring attention, give the loss and every parameter gradient of one process
attending to the whole sequence (and so do four, two context groups sharing the batch)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrun.common import builtin
from rlrun.common.wire.trace import Channel
from rlrun.common.wire.training import TrainingBatch, TrainingSample
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.loss import summarize
from rlrun.trainer.packing import count_channel_tokens, pack_first_fit_decreasing
from rlrun.trainer.synthetic import synthetic_config

RANK_SCRIPT = Path(__file__).with_name("context_parallel_rank.py")
CAPACITY = 96  # packed tokens per micro-batch: 48 per rank


def sample(rng: np.random.Generator, length: int, vocab: int, loss: str) -> TrainingSample:
    """A prompt of a quarter of the tokens that never trains, then a trained completion."""
    prompt = length // 4
    mask = [False] * prompt + [True] * (length - prompt)
    value = float(rng.choice([-1.0, 1.0])) if loss == "rl" else 1.0
    return TrainingSample(
        token_ids=[int(t) for t in rng.integers(3, vocab, size=length)],
        mask=mask,
        logprobs=[0.0] * prompt + [float(x) for x in rng.uniform(-5.0, -3.0, size=length - prompt)],
        temperatures=[0.8] * length,
        channels=[Channel(loss, [value if m else 0.0 for m in mask])],
    )


def batch_of(lengths: list[int], vocab: int) -> TrainingBatch:
    rng = np.random.default_rng(7)
    samples = [sample(rng, n, vocab, "ce" if i == 1 else "rl") for i, n in enumerate(lengths)]
    return TrainingBatch(step=0, policy_version=0, samples=samples)


def variant(folder: Path, name: str, **changes) -> Path:
    """The shipped tiny model `name` with `changes` to its config, written under `folder`."""
    arch = json.loads(builtin.model_config(name).read_text())
    path = folder / f"{name}-variant.json"
    path.write_text(json.dumps({**arch, **changes}))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(tmp_path: Path, world_size: int, config, batch: TrainingBatch) -> dict:
    """`world_size` ranks of the rank script; rank 0's result."""
    job, result = tmp_path / "job.pt", tmp_path / "result.pt"
    torch.save((config, batch), job)
    world = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size)}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT), str(job), str(result)],
            env={**os.environ, **world, "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"},
        )
        for rank in range(world_size)
    ]
    try:
        codes = [rank.wait(timeout=240) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert codes == [0] * world_size
    return torch.load(result)


# Lengths: packed first-fit-decreasing into two micro-batches of 95 and 93 (llama) or 89 and 75
# (gpt2) tokens, padded to 96, where the longest sample spans both ranks' halves and several
# samples share one. Llama with two query heads per K/V head (the ring passes grouped K/V) and
# rotary positions; GPT-2 (at most 64 positions) with learned ones; the char tokenizer's 102
# tokens need a vocabulary of 128. Four ranks are two context groups of two, each training one
# of the micro-batches (data parallelism across the groups; slow: four processes).
LLAMA_GQA = {"name": "tiny-d64", "num_key_value_heads": 2}
CASES = {
    "fsdp-llama-gqa": ("fsdp", LLAMA_GQA, [70, 20, 5, 60, 33], 2),
    "ddp-gpt2": ("ddp", {"name": "tiny-gpt2-d64", "vocab_size": 128}, [50, 30, 9, 40, 35], 2),
    "fsdp-llama-gqa-two-groups": ("fsdp", LLAMA_GQA, [70, 20, 5, 60, 33], 4),
}
VOCAB = 128


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if CASES[case][3] > 2 else []) for case in CASES]
)
def test_context_parallel_ranks_give_the_loss_and_gradients_of_one_process(case, tmp_path):
    parallel, arch, lengths, world_size = CASES[case]
    model = variant(tmp_path, **arch)
    bins = pack_first_fit_decreasing(lengths, CAPACITY)
    assert len(bins) == 2 and all(sum(lengths[i] for i in b) > CAPACITY // 2 for b in bins)
    assert max(lengths) > CAPACITY // 2, "one sample must be longer than one rank holds"
    batch = batch_of(lengths, VOCAB)
    trainer = {"micro_batch_tokens": CAPACITY, "parallel": parallel}
    single = build_learner(synthetic_config(tmp_path, model=model, trainer=trainer), Parallelism.single())
    counts = count_channel_tokens(batch.samples)
    expected_loss = summarize(
        single.accumulate(single.plan(batch), counts), counts.rl, counts.ce, counts.trained
    )
    expected = {name: param.grad for name, param in single.model.named_parameters()}

    config = synthetic_config(tmp_path, model=model, trainer={**trainer, "context_parallel": 2})
    got = run_ranks(tmp_path, world_size, config, batch)

    assert got["loss"] == pytest.approx(expected_loss["loss"], rel=1e-5)
    assert got["grads"].keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
