"""The vLLM engine on a GPU: generation with logprobs, scoring, weight updates from the
gRPC stream. Skipped where there is no CUDA device or no vllm."""

import asyncio

import pytest
import torch

from rlrun.common.model import PackedCausal, build_model
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.common.wire.sampling import SamplingParams

from .conftest import REPO, run_config

pytestmark = pytest.mark.gpu

# bf16 on the GPU against a float32 recomputation on the CPU.
TOLERANCE = 0.05


@pytest.fixture
async def engine(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("vllm")
    from rlrun.inference.engines.vllm_engine import VllmEngine

    config = run_config(
        tmp_path,
        f'model.config="{REPO / "configs/models/tiny-d128.json"}"',
        'model.dtype="bfloat16"',
        "model.max_model_len=64",
        'inference.engine="vllm"',
        "inference.vllm.enforce_eager=true",
        "inference.vllm.gpu_memory_utilization=0.3",
    )
    engine = VllmEngine(config)
    await engine.start()
    yield engine
    await engine.stop()


def recomputed_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor(prompt + completion)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))
    logits = logits[len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def cpu_twin(config, tensors=None):
    model = build_model(config.model).float()
    if tensors is not None:
        model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    return model


async def test_generate_returns_the_contract(engine):
    prompt = [4, 70, 71, 72, 1, 5]
    params = SamplingParams(max_tokens=12, temperature=0.8, n=4, stop_token_ids=[1])
    completions = await engine.generate(prompt, params)
    model = cpu_twin(engine.config)
    assert len(completions) == 4
    for completion in completions:
        assert completion.finish_reason in ("stop", "length")
        if completion.finish_reason == "stop":
            assert completion.token_ids[-1] == 1
        expected = recomputed_logprobs(model, prompt, completion.token_ids, 0.8)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=TOLERANCE, rtol=0)


async def test_concurrent_requests_and_streams(engine):
    params = SamplingParams(max_tokens=10, temperature=1.0, n=2)
    results = await asyncio.gather(*[engine.generate([4, 60 + i, 5], params) for i in range(16)])
    assert all(len(r) == 2 for r in results)
    tokens = 0
    async for deltas in engine.stream([4, 70, 5], SamplingParams(max_tokens=6, temperature=1.0)):
        tokens += sum(len(d.token_ids) for d in deltas)
    assert tokens == 6


async def test_score_matches_a_recomputation(engine):
    tokens = [4, 70, 71, 72, 73, 1, 5]
    result = await engine.score(tokens, 3, 1.0)
    expected = recomputed_logprobs(cpu_twin(engine.config), tokens[:3], tokens[3:], 1.0)
    torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=TOLERANCE, rtol=0)


async def test_a_weight_update_changes_outputs_and_a_rollback_goes_back(engine):
    other = broadcast_tensors(build_model(engine.config.model.model_copy(update={"seed": 7})))
    await engine.update_weights(other, version=2)
    assert engine.policy_version == 2
    prompt = [4, 70, 5]
    [completion] = await engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0))
    expected = recomputed_logprobs(cpu_twin(engine.config, other), prompt, completion.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=TOLERANCE, rtol=0)
    assert (completion.policy_version_start, completion.policy_version_end) == (2, 2)
    # The servicer refuses an older version unless the trainer marks a rollback; the engine
    # applies what it is given.
    await engine.update_weights(other, version=1)
    assert engine.policy_version == 1
