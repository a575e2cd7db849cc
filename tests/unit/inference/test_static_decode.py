"""The torch engine's static-shape decode steps (`static_decode`) against plain forward passes
of the same model: greedy decoding, logprobs, padding rows, rows joining and leaving across
buckets, cancellation, weight updates. On CPU they run eagerly (`static`); the same tests
replay CUDA graphs (`graphs`) where a GPU is present."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from rlrun.common.config.inference import InferenceConfig
from rlrun.common.model import ArchConfig, CausalLM, PackedCausal, SlotKVCache, create_model
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.core_protocol import DONE, ApplyWeights, Cancel, Submit
from rlrun.inference.engines.static_decode import (
    StaticDecoder,
    decode_mode,
    default_batch_buckets,
    span_buckets,
)
from rlrun.inference.engines.torch_core import TorchEngineCore
from rlrun.inference.sampler import BatchSampler, RowSettings

from .conftest import REPO, tiny_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MODES = [
    pytest.param(("static", "cpu"), id="static-cpu"),
    pytest.param(("graphs", "cuda"), id="graphs-cuda", marks=[pytest.mark.gpu, needs_cuda]),
]


@pytest.fixture(params=MODES)
def mode(request) -> tuple[str, str]:
    return request.param


def gqa_model(seed: int = 5) -> CausalLM:
    """A Qwen3-shaped model (q/k norms, two query heads per K/V head), with PyTorch's init,
    whose logits are peaked enough that greedy ties do not occur."""
    cfg = json.loads((REPO / "configs/models/tiny-d64.json").read_text())
    cfg.update(model_type="qwen3", num_key_value_heads=2)
    model = create_model(ArchConfig.from_dict(cfg))
    model.init_weights(seed, "pytorch")
    return model


def gpt2_model() -> CausalLM:
    model = create_model(ArchConfig.from_file(REPO / "configs/models/tiny-gpt2-d64.json"))
    model.init_weights(7, "pytorch")
    return model


FAMILIES = {"llama": (tiny_model, 160), "qwen3-gqa": (gqa_model, 160), "gpt2": (gpt2_model, 64)}
"""Model and max_model_len (GPT-2's learned positions stop at 64)."""


def forward_logits(model: CausalLM, token_ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.inference_mode():
        ids = torch.tensor(token_ids, device=device)
        return model(ids, torch.arange(len(ids), device=device), PackedCausal([len(ids)])).float().cpu()


def argmax_loop(model: CausalLM, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(forward_logits(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def assert_greedy(model: CausalLM, prompt: list[int], completion: list[int]) -> None:
    """`completion` is the forward-argmax loop's: exactly on CPU; on CUDA, where the plain
    pass runs other kernels that may split a near tie the other way, each token is the
    argmax of the recomputed pass up to float rounding."""
    if next(model.parameters()).device.type == "cpu":
        assert completion == argmax_loop(model, prompt, len(completion))
        return
    logits = forward_logits(model, prompt + completion)[len(prompt) - 1 : -1]
    chosen = logits.gather(1, torch.tensor(completion)[:, None])[:, 0]
    assert bool((chosen >= logits.amax(-1) - 1e-4).all())


def recomputed_logprobs(model, prompt, completion, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """Each token's logprob under the tempered distribution renormalised over its top-k and
    then its top-p nucleus."""
    logits = forward_logits(model, prompt + completion)[len(prompt) - 1 : -1].double() / temperature
    logprobs = []
    for row, token in zip(torch.softmax(logits, -1), completion, strict=True):
        probs, order = row.sort(descending=True)
        if top_k:
            probs, order = probs[:top_k], order[:top_k]
        probs = probs / probs.sum()
        nucleus = probs.cumsum(0) - probs < top_p
        kept = dict(
            zip(order[nucleus].tolist(), (probs[nucleus] / probs[nucleus].sum()).tolist(), strict=True)
        )
        logprobs.append(math.log(kept[token]))
    return torch.tensor(logprobs)


def make_core(model: CausalLM, decode: str, max_model_len: int, **kwargs) -> TorchEngineCore:
    kwargs = {"max_batch_size": 8, "max_waiting": 64, "seed": 0} | kwargs
    return TorchEngineCore(model, max_model_len=max_model_len, decode=decode, **kwargs)


def record_shapes(core: TorchEngineCore) -> list[tuple[int, int]]:
    """The (rows, span) bucket of each static step the core takes from now on."""
    shapes: list[tuple[int, int]] = []
    choose = core._static.shape

    def shape(used: int, span: int) -> tuple[int, int]:
        shapes.append(choose(used, span))
        return shapes[-1]

    core._static.shape = shape
    return shapes


def drive(core: TorchEngineCore, plan: dict[int, list]) -> dict[int, object]:
    """Steps `core` until it is idle and `plan` is spent, handling plan[i] before step i;
    returns the DONE values by request id."""
    done: dict[int, object] = {}
    plan = dict(plan)
    step = 0
    with torch.inference_mode():
        while plan or core.has_work():
            for command in plan.pop(step, []):
                core.handle(command)
            if core.has_work():
                core.step()
            output = core.take_output()
            if output is not None:
                done.update((event[1], event[2]) for event in output.events if event[0] == DONE)
            step += 1
    return done


def greedy(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_static_steps_equal_a_forward_argmax_loop_as_rows_join_and_leave(mode, family):
    decode, device = mode
    build, max_len = FAMILIES[family]
    model = build().to(device)
    core = make_core(model, decode, max_len)
    shapes = record_shapes(core)
    requests = {
        0: ([5, 6, 7, 8], greedy(max_len - 6, n=2)),
        1: ([10, 11], greedy(9)),
        2: ([20, 21, 22, 23, 24, 25, 26, 27, 28], greedy(30, n=3)),
        3: ([30], greedy(12)),
    }
    # 1 leaves early; 2 joins the running batch and 3 a slot that 1 gave back.
    submits = {rid: Submit(rid, *request, False, 0.0) for rid, request in requests.items()}
    done = drive(core, {0: [submits[0], submits[1]], 4: [submits[2]], 14: [submits[3]]})
    for rid, (prompt, params) in requests.items():
        assert len(done[rid]) == params.n
        for completion in done[rid]:
            assert len(completion.token_ids) == params.max_tokens
            assert_greedy(model, prompt, completion.token_ids)
    assert len({rows for rows, _ in shapes}) > 2  # the batch went through several row buckets
    assert {span for _, span in shapes} == set(span_buckets(max_len))  # and every span bucket


def test_sampled_logprobs_equal_a_recomputed_pass(mode):
    decode, device = mode
    model = gqa_model().to(device)
    core = make_core(model, decode, 96)
    prompt = [5, 6, 7, 8]
    settings = {
        0: SamplingParams(max_tokens=70, temperature=0.8, n=3),
        1: SamplingParams(max_tokens=70, temperature=1.3, top_k=5),
        2: SamplingParams(max_tokens=50, temperature=0.6, top_p=0.7),
        3: SamplingParams(max_tokens=60, temperature=0.0),
    }
    done = drive(core, {0: [Submit(rid, prompt, params, False, 0.0) for rid, params in settings.items()]})
    for rid, params in settings.items():
        for completion in done[rid]:
            expected = recomputed_logprobs(
                model, prompt, completion.token_ids, params.temperature or 1.0, params.top_k, params.top_p
            )
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_cancelling_a_request_mid_batch_leaves_the_others_exact(mode):
    decode, device = mode
    model = tiny_model().to(device)
    core = make_core(model, decode, 96)
    shapes = record_shapes(core)
    requests = {0: ([5, 6, 7], greedy(40)), 1: ([8, 9], greedy(40, n=2)), 2: ([12], greedy(40))}
    plan = {0: [Submit(rid, *r, False, 0.0) for rid, r in requests.items()], 6: [Cancel(1)]}
    done = drive(core, plan)
    assert 1 not in done
    assert len(shapes) > 30  # the steps after the cancellation were static ones too
    for rid in (0, 2):
        prompt, params = requests[rid]
        assert len(done[rid][0].token_ids) == params.max_tokens
        assert_greedy(model, prompt, done[rid][0].token_ids)


def test_a_weight_update_between_steps_reaches_the_static_step(mode):
    decode, device = mode
    model = tiny_model().to(device)
    core = make_core(model, decode, 64)
    prompt = [5, 6, 7, 8]
    before = tiny_model().to(device)  # `model` as it was: the update copies into it
    other = tiny_model(seed=11).to(device)
    update = ApplyWeights(9, 2, {k: v.clone() for k, v in other.state_dict().items()})
    # The first request's steps capture the graphs (rows 1, span 64) the second one replays.
    plan = {
        0: [Submit(0, prompt, greedy(20), False, 0.0)],
        30: [update, Submit(1, prompt, greedy(20), False, 0.0)],
    }
    done = drive(core, plan)
    assert_greedy(before, prompt, done[0][0].token_ids)
    assert_greedy(other, prompt, done[1][0].token_ids)
    assert done[1][0].token_ids != done[0][0].token_ids
    assert done[1][0].policy_version_start == 2


def test_a_parameter_replaced_instead_of_copied_into_fails_the_update():
    model = tiny_model()
    core = make_core(model, "static", 48)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone(), requires_grad=False)
    with pytest.raises(RuntimeError, match="in place"):
        core.apply_weights({"lm_head.weight": torch.zeros_like(model.lm_head.weight)}, 1)


def test_padding_rows_change_no_live_row_and_no_other_slot():
    model = gqa_model().eval()
    cfg = model.config

    def filled_cache() -> SlotKVCache:
        cache = SlotKVCache(cfg.num_layers, 9, 64, cfg.num_kv_heads, cfg.head_dim, torch.float32)
        generator = torch.Generator().manual_seed(1)
        for store in (*cache.k, *cache.v):
            store.copy_(torch.randn(store.shape, generator=generator))
        return cache

    def stores(cache: SlotKVCache) -> list[torch.Tensor]:
        return [store.clone() for store in (*cache.k, *cache.v)]

    # Step 1 runs slots 4, 1 and 6; step 2 only 4 and 1, so row 6 is padding that ran a
    # sequence before, and slot 6 is cleared between them as a free slot's content may be
    # anything. Each step is checked against the eager step at the batch's own shape.
    steps = [
        (torch.tensor([3, 9, 7]), torch.tensor([4, 1, 6]), torch.tensor([10, 3, 20])),
        (torch.tensor([5, 2]), torch.tensor([4, 1]), torch.tensor([11, 4])),
    ]
    for rows in (7, 8):
        cache, eager_cache = filled_cache(), filled_cache()
        decoder = StaticDecoder(model, cache, capture=False)
        for tokens, slots, positions in steps:
            if len(slots) == 2:
                for store in (*cache.k, *cache.v, *eager_cache.k, *eager_cache.v):
                    store[6] = 0
            before = stores(cache)
            with torch.inference_mode():
                static = decoder.hidden_states(tokens, slots, positions, (rows, 64))
                eager = model.hidden_states(tokens, positions, eager_cache.step(slots, positions))
            torch.testing.assert_close(static, eager)
            live = torch.zeros(9, 64, dtype=torch.bool)
            live[slots, positions] = True
            untouched = ~live
            untouched[8] = False  # the scratch slot
            for ours, previous, eagers in zip(stores(cache), before, stores(eager_cache), strict=True):
                torch.testing.assert_close(ours[live], eagers[live])
                assert torch.equal(ours[untouched], previous[untouched])


def test_buckets_cover_every_batch_and_span_with_bounded_padding():
    for max_batch in (1, 5, 8, 128, 300):
        buckets = default_batch_buckets(max_batch)
        assert buckets[-1] == max_batch and buckets == sorted(set(buckets))
        for used in range(1, max_batch + 1):
            bucket = next(b for b in buckets if b >= used)
            assert bucket <= max(used * 5 // 4 + 1, 8) or bucket == max_batch
    for max_len in (48, 64, 200, 4096, 40960):
        buckets = span_buckets(max_len)
        assert buckets[-1] == max_len
        assert all(s % 16 == 0 for s in buckets[:-1])
        for needed in range(1, max_len + 1):
            span = next(s for s in buckets if s >= needed)
            assert span <= max(needed * 3 // 2, 64)


def test_cuda_graphs_setting_is_checked_and_resolved_per_device():
    with pytest.raises(ValidationError, match="inference.cuda_graphs"):
        InferenceConfig(cuda_graphs="on")
    with pytest.raises(ValidationError, match="inference.cuda_graph_batch_sizes"):
        InferenceConfig(device="cuda", max_batch_size=8, cuda_graph_batch_sizes=[4, 9])
    config = InferenceConfig(
        device="cuda:1", cuda_graphs="on", max_batch_size=8, cuda_graph_batch_sizes=[2, 8]
    )
    assert decode_mode(config.cuda_graphs, config.device) == "graphs"
    assert decode_mode("auto", "cuda") == "graphs"
    assert decode_mode("auto", "cpu") == "eager"
    assert decode_mode("off", "cuda") == "eager"


# -- CUDA only -------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_a_replayed_step_with_sampling_does_not_wait_for_the_device():
    model = gqa_model().to("cuda", torch.bfloat16).eval()
    cfg = model.config
    cache = SlotKVCache(cfg.num_layers, 9, 128, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, "cuda")
    decoder = StaticDecoder(model, cache, capture=True)
    tokens = torch.tensor([3, 9, 4], device="cuda")
    slots = torch.tensor([0, 2, 5], device="cuda")
    positions = torch.tensor([7, 30, 2], device="cuda")
    sampler = BatchSampler([RowSettings(temperature=0.9, top_p=0.95)] * 3, "cuda")
    generator = torch.Generator("cuda").manual_seed(0)
    with torch.inference_mode():
        decoder.hidden_states(tokens, slots, positions, decoder.shape(6, 31))  # captures
        assert list(decoder.graphs) == [(8, 64)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            hidden = decoder.hidden_states(tokens, slots, positions + 1, decoder.shape(6, 32))
            sampled = sampler.sample(model.lm_head(hidden), generator)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert sampled.tokens.shape == (3,)


@pytest.mark.gpu
@needs_cuda
def test_bf16_graph_logprobs_equal_a_recomputed_pass_within_bf16_tolerance():
    model = gqa_model().to("cuda", torch.bfloat16)
    core = make_core(model, "graphs", 128)
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=100, temperature=1.0, n=4)
    done = drive(core, {0: [Submit(0, prompt, params, False, 0.0)]})
    assert core._static.graphs
    for completion in done[0]:
        expected = recomputed_logprobs(model, prompt, completion.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected.float(), atol=0.1, rtol=0.02)
