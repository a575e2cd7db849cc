"""The torch engine against plain forward passes of the same model: greedy decoding, logprobs,
continuous batching, weight updates, cancellation, pausing, scoring."""

import asyncio
import json
import math
from dataclasses import replace

import pytest
import torch
from prometheus_client import REGISTRY

from rlrun.common.errors import RequestError
from rlrun.common.model import PackedCausal
from rlrun.common.tokenizer import CharTokenizer
from rlrun.common.weights.grpc_stream import WeightAssembler, iter_update_messages
from rlrun.common.weights.protocol import TensorLayout
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.weights import update_message_from_proto
from rlrun.inference.engines.base import QueueFullError
from rlrun.inference.engines.core_protocol import DONE, Submit
from rlrun.inference.engines.torch_core import TorchEngineCore
from rlrun.inference.engines.torch_engine import TorchEngine
from rlrun.inference.params import GenerationParams
from rlrun.inference.structured import GrammarCompiler

from ...support import reference_sampling
from ...support.knobs import knobbed
from .conftest import MAX_MODEL_LEN, REPO, tiny_model


def full_forward(model, token_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor(token_ids)
    with torch.no_grad():
        return model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))


def argmax_loop(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(full_forward(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def recomputed_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Each token's logprob under the tempered distribution, renormalised over the k most
    likely tokens and then over the nucleus of what is left."""
    logits = full_forward(model, prompt + completion)[len(prompt) - 1 : -1] / temperature
    logprobs = []
    for row, token in zip(torch.softmax(logits.double(), -1), completion, strict=True):
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


PROMPTS = [[5, 6, 7, 8], [10, 11], [20, 21, 22, 23, 24, 25, 26, 27, 28], [40]]


async def test_greedy_output_equals_a_forward_argmax_loop_while_batched(engine, model):
    # Prompts of different lengths, several samples each, all in one continuous batch.
    params = SamplingParams(max_tokens=20, temperature=0.0, n=2)
    results = await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])
    for prompt, completions in zip(PROMPTS, results, strict=True):
        reference = argmax_loop(model, prompt, 20)
        for completion in completions:
            assert completion.token_ids == reference
            assert completion.finish_reason == "length"


async def test_outputs_stay_exact_as_sequences_finish_and_join_at_different_steps(engine, model):
    # Rows that finish leave the batch between two steps; the rest carry on, and a request
    # admitted later joins them. A sampled row among greedy ones checks that each row keeps
    # its own settings as the rows shift.
    lengths = (3, 7, 12, 20)
    greedy = [
        asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=n, temperature=0.0)))
        for p, n in zip(PROMPTS, lengths, strict=True)
    ]
    sampled = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_tokens=18, temperature=0.7)))
    await greedy[0]
    late = await engine.generate([30, 31, 32], SamplingParams(max_tokens=9, temperature=0.0))
    for prompt, n, task in zip(PROMPTS, lengths, greedy, strict=True):
        [completion] = await task
        assert completion.token_ids == argmax_loop(model, prompt, n)
    assert late[0].token_ids == argmax_loop(model, [30, 31, 32], 9)
    [completion] = await sampled
    torch.testing.assert_close(
        torch.tensor(completion.logprobs),
        recomputed_logprobs(model, PROMPTS[0], completion.token_ids, 0.7),
        atol=1e-4,
        rtol=0,
    )


def test_rows_that_join_a_running_batch_are_sampled_with_their_own_settings(model):
    # The batch's sampler outlives rows that join with its settings; these have others.
    core = TorchEngineCore(model, max_model_len=MAX_MODEL_LEN, max_batch_size=8, max_waiting=64, seed=0)
    joining = {
        1: (PROMPTS[1], SamplingParams(max_tokens=12, temperature=0.0)),
        2: (PROMPTS[2], SamplingParams(max_tokens=12, temperature=1.0, top_k=1)),
        3: (PROMPTS[3], SamplingParams(max_tokens=12, temperature=0.0, n=2)),
    }
    events = []
    with torch.inference_mode():
        core.handle(Submit(0, PROMPTS[0], SamplingParams(max_tokens=30, temperature=1.0, n=3), False, 0.0))
        for rid, (prompt, params) in joining.items():
            for _ in range(2):
                core.step()
            core.handle(Submit(rid, prompt, params, False, 0.0))
        while core.has_work():
            core.step()
            events += core.take_output().events
    done = {event[1]: event[2] for event in events if event[0] == DONE}
    for rid, (prompt, _) in joining.items():
        assert all(c.token_ids == argmax_loop(model, prompt, 12) for c in done[rid])
    assert len(done[0]) == 3


async def test_logprobs_equal_a_recomputed_forward_pass(engine, model):
    settings = [
        SamplingParams(max_tokens=25, temperature=0.8, n=3),
        SamplingParams(max_tokens=25, temperature=1.3, top_k=5),
        SamplingParams(max_tokens=25, temperature=0.6, top_p=0.7),
        SamplingParams(max_tokens=25, temperature=0.0),
    ]
    results = await asyncio.gather(*[engine.generate(PROMPTS[0], s) for s in settings])
    for params, completions in zip(settings, results, strict=True):
        for completion in completions:
            expected = recomputed_logprobs(
                model, PROMPTS[0], completion.token_ids, params.temperature or 1.0, params.top_k, params.top_p
            )
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


async def test_top_logprobs_are_the_most_likely_tokens_of_a_recomputed_forward_pass(engine, model):
    # Rows asking for different counts (and one for none) share the batch.
    settings = [
        GenerationParams(max_tokens=12, temperature=0.7, n=2, top_logprobs=4),
        GenerationParams(max_tokens=12, temperature=0.0, top_logprobs=2),
        GenerationParams(max_tokens=12, temperature=1.0),
    ]
    results = await asyncio.gather(*[engine.generate(PROMPTS[2], s) for s in settings])
    for params, completions in zip(settings, results, strict=True):
        for completion in completions:
            if not params.top_logprobs:
                assert completion.top_logprobs is None
                continue
            temperature = params.temperature or 1.0
            tokens = PROMPTS[2] + completion.token_ids
            logits = full_forward(model, tokens)[len(PROMPTS[2]) - 1 : -1] / temperature
            expected = torch.log_softmax(logits, -1).topk(params.top_logprobs, dim=-1)
            assert len(completion.top_logprobs) == len(completion.token_ids)
            for position, (values, ids) in enumerate(zip(*expected, strict=True)):
                top = completion.top_logprobs[position]
                assert [token for token, _ in top] == ids.tolist()
                torch.testing.assert_close(torch.tensor([v for _, v in top]), values, atol=1e-4, rtol=0)
            if params.temperature == 0:
                assert [top[0][0] for top in completion.top_logprobs] == completion.token_ids


def adjusted_logits(
    model, prompt: list[int], completion: list[int], params: GenerationParams
) -> torch.Tensor:
    """The logits each completion token was drawn from."""
    logits = full_forward(model, prompt + completion)[len(prompt) - 1 : -1]
    return reference_sampling.adjusted_logits(logits, prompt, completion, params)


def adjusted_argmax_loop(model, prompt: list[int], steps: int, params: GenerationParams) -> list[int]:
    completion: list[int] = []
    for _ in range(steps):
        completion.append(int(adjusted_logits(model, prompt, completion + [0], params)[-1].argmax()))
    return completion


PENALISED = knobbed(max_tokens=16, temperature=0.0, presence_penalty=0.4, frequency_penalty=0.3)


async def test_greedy_penalised_and_biased_output_equals_a_loop_over_the_adjusted_logits(engine, model):
    # Penalised, biased and plain rows share the batch; rows finish and join at different
    # steps, so each penalised row keeps its own counts across every change of the batch.
    biased = knobbed(max_tokens=10, temperature=0.0, logit_bias={17: 0.8, 23: -5.0})
    settings = [
        (PROMPTS[0], PENALISED),
        (PROMPTS[1], GenerationParams(max_tokens=5, temperature=0.0)),
        (PROMPTS[2], biased),
        (PROMPTS[3], knobbed(max_tokens=20, temperature=0.0, frequency_penalty=-0.5, n=2)),
        (PROMPTS[2], knobbed(max_tokens=14, temperature=0.0, repetition_penalty=1.8)),
    ]
    results = await asyncio.gather(*[engine.generate(prompt, params) for prompt, params in settings])
    late = await engine.generate(PROMPTS[1], PENALISED)
    for (prompt, params), completions in [
        *zip(settings, results, strict=True),
        ((PROMPTS[1], PENALISED), late),
    ]:
        expected = adjusted_argmax_loop(model, prompt, params.max_tokens, params)
        assert all(c.token_ids == expected for c in completions)
    # Each adjustment changed what was generated.
    assert results[0][0].token_ids != argmax_loop(model, PROMPTS[0], 16)
    assert results[2][0].token_ids != argmax_loop(model, PROMPTS[2], 10)
    assert results[3][0].token_ids != argmax_loop(model, PROMPTS[3], 20)
    assert results[4][0].token_ids != argmax_loop(model, PROMPTS[2], 14)


async def test_logprobs_are_under_the_biased_and_penalised_distribution(engine, model):
    settings = [
        knobbed(max_tokens=20, temperature=0.8, presence_penalty=1.5, frequency_penalty=0.7, n=2),
        knobbed(max_tokens=20, temperature=1.3, top_k=6, logit_bias={9: 2.0, 30: -1.0}),
        knobbed(max_tokens=20, temperature=0.0, frequency_penalty=2.0, top_logprobs=3),
        knobbed(max_tokens=20, temperature=0.9, repetition_penalty=1.5, presence_penalty=-0.5),
        knobbed(max_tokens=20, temperature=1.1, repetition_penalty=0.7, n=2),
        GenerationParams(max_tokens=20, temperature=0.7),
    ]
    results = await asyncio.gather(*[engine.generate(PROMPTS[2], s) for s in settings])
    for params, completions in zip(settings, results, strict=True):
        for completion in completions:
            scaled = adjusted_logits(model, PROMPTS[2], completion.token_ids, params) / (
                params.temperature or 1.0
            )
            if params.top_k:  # renormalised over the k most likely adjusted tokens
                scaled = scaled.masked_fill(
                    scaled < scaled.topk(params.top_k, -1).values[:, -1:], float("-inf")
                )
            expected = torch.log_softmax(scaled, -1)
            chosen = expected.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(completion.logprobs), chosen, atol=1e-4, rtol=0)
            if params.top_logprobs:
                assert [[t for t, _ in top] for top in completion.top_logprobs] == (
                    expected.topk(params.top_logprobs, -1).indices.tolist()
                )


async def test_no_stop_token_is_drawn_before_min_tokens(engine, model):
    # A bias makes the stop token the likeliest by far: without min_tokens every sample would
    # stop at once. Penalised rows and plain ones share the batch.
    stop = 17
    settings = [
        knobbed(max_tokens=12, temperature=1.0, n=4, stop_token_ids=[stop], logit_bias={stop: 6.0}),
        knobbed(
            max_tokens=12, temperature=1.0, n=4, stop_token_ids=[stop], logit_bias={stop: 6.0}, min_tokens=5
        ),
        knobbed(max_tokens=12, temperature=0.0, stop_token_ids=[stop], frequency_penalty=0.5, min_tokens=8),
        GenerationParams(max_tokens=12, temperature=0.8, stop_token_ids=[stop]),
    ]
    results = await asyncio.gather(*[engine.generate(PROMPTS[1], s) for s in settings])
    assert all(c.token_ids == [stop] for c in results[0])
    for params, completions in zip(settings[1:3], results[1:3], strict=True):
        for completion in completions:
            assert len(completion.token_ids) > params.knobs["min_tokens"]
            assert stop not in completion.token_ids[: params.knobs["min_tokens"]]
            # The logprobs are those of the masked distribution, renormalised without the stop.
            scaled = adjusted_logits(model, PROMPTS[1], completion.token_ids, params) / (
                params.temperature or 1.0
            )
            expected = torch.log_softmax(scaled, -1).gather(1, torch.tensor(completion.token_ids)[:, None])[
                :, 0
            ]
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
    assert [c.finish_reason for c in results[1]] == ["stop"] * 4  # and then it comes


async def test_a_large_logit_bias_forces_or_forbids_a_token(engine, model):
    forcing = knobbed(max_tokens=12, temperature=1.0, logit_bias={42: 100.0})
    [forced] = await engine.generate(PROMPTS[0], forcing)
    assert forced.token_ids == [42] * 12
    greedy = argmax_loop(model, PROMPTS[0], 12)
    forbidden = {token: -100.0 for token in greedy}
    avoided = await engine.generate(
        PROMPTS[0], knobbed(max_tokens=12, temperature=0.0, n=3, logit_bias=forbidden)
    )
    for completion in avoided:
        assert not set(completion.token_ids) & set(greedy)


async def test_streamed_deltas_carry_their_positions_top_logprobs(engine):
    params = GenerationParams(max_tokens=6, temperature=1.0, seed=3, top_logprobs=3)
    [whole] = await engine.generate(PROMPTS[0], params)
    streamed = [
        top
        for deltas in [d async for d in engine.stream(PROMPTS[0], params)]
        for d in deltas
        for top in d.top_logprobs
    ]
    assert streamed == whole.top_logprobs and all(len(top) == 3 for top in streamed)


async def test_a_short_request_submitted_after_a_long_one_finishes_first(engine):
    long = engine.stream([5, 6, 7], SamplingParams(max_tokens=MAX_MODEL_LEN - 3, temperature=1.0))
    await anext(long)  # the long request is decoding
    finished = []

    async def drain():
        async for _ in long:
            pass
        finished.append("long")

    async def short():
        await engine.generate([9, 9], SamplingParams(max_tokens=2, temperature=1.0))
        finished.append("short")

    await asyncio.gather(drain(), short())
    assert finished == ["short", "long"]


async def test_stop_tokens_end_a_sample_and_are_returned(engine, model):
    reference = argmax_loop(model, PROMPTS[1], 12)
    stop = reference[5]
    [completion] = await engine.generate(
        PROMPTS[1], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop])
    )
    assert completion.token_ids == reference[: reference.index(stop) + 1]
    assert completion.finish_reason == "stop"


async def test_a_seed_makes_sampling_reproducible(engine):
    params = SamplingParams(max_tokens=15, temperature=1.0, n=3, seed=7)
    first = await engine.generate(PROMPTS[0], params)
    _, second = await asyncio.gather(
        engine.generate(PROMPTS[2], SamplingParams(max_tokens=9, temperature=1.0)),
        engine.generate(PROMPTS[0], params),
    )
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert len({tuple(c.token_ids) for c in first}) > 1


async def test_a_weight_update_changes_outputs_and_version(engine):
    params = SamplingParams(max_tokens=15, temperature=0.0)
    [before] = await engine.generate(PROMPTS[0], params)
    other = tiny_model(seed=11)
    await engine.update_weights({k: v.clone() for k, v in other.state_dict().items()}, version=4)
    [after] = await engine.generate(PROMPTS[0], params)
    assert after.token_ids == argmax_loop(other, PROMPTS[0], 15)
    assert after.token_ids != before.token_ids
    assert (after.policy_version_start, after.policy_version_end) == (4, 4)
    assert engine.status().policy_version == 4


async def test_a_failed_weight_update_leaves_model_and_version_unchanged(engine):
    params = SamplingParams(max_tokens=15, temperature=0.0)
    [before] = await engine.generate(PROMPTS[0], params)
    await engine.update_weights({k: v.clone() for k, v in engine.weight_specs().items()}, version=3)
    # (An older version is the servicer's to refuse, unless the trainer marks a rollback:
    # tests/integration/inference/test_grpc_service.py.)
    other = {k: v.clone() for k, v in tiny_model(seed=11).state_dict().items()}
    broken = dict(other)
    broken["lm_head.weight"] = broken["lm_head.weight"][:, :-1]
    with pytest.raises(RequestError, match="lm_head.weight"):
        await engine.update_weights(broken, version=5)
    # Tensors received against another receiver's tensors are checked all the same.
    header, *chunks = map(update_message_from_proto, iter_update_messages(broken, 5))
    assembler = WeightAssembler(header, TensorLayout(header.tensors, broken))
    for chunk in chunks:
        assembler.add(chunk)
    with pytest.raises(RequestError, match="lm_head.weight"):
        await engine.update_weights(assembler.finish(), version=5)
    [after] = await engine.generate(PROMPTS[0], params)
    assert after.token_ids == before.token_ids
    assert engine.policy_version == 3


async def test_versions_record_an_update_in_the_middle_of_a_sample(engine):
    await engine.pause()
    long = asyncio.create_task(
        engine.generate([5, 6, 7], SamplingParams(max_tokens=MAX_MODEL_LEN - 3, temperature=1.0))
    )
    await asyncio.sleep(0)
    await engine.resume()
    # A probe admitted after the long request: once it has a token, so has the long one.
    probe = engine.stream([9], SamplingParams(max_tokens=2, temperature=1.0))
    await anext(probe)
    await engine.pause()
    await engine.update_weights({k: v.clone() for k, v in engine.weight_specs().items()}, version=1)
    await engine.resume()
    [completion] = await long
    assert (completion.policy_version_start, completion.policy_version_end) == (0, 1)
    await probe.aclose()


async def test_a_cancelled_request_frees_its_slot_at_once():
    engine = TorchEngine(
        tiny_model(), model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=1, max_waiting=8
    )
    await engine.start()
    try:
        hog = engine.stream([5, 6], SamplingParams(max_tokens=MAX_MODEL_LEN - 2, temperature=1.0))
        await anext(hog)  # the hog holds the only slot
        queued = asyncio.create_task(engine.generate([7, 8], SamplingParams(max_tokens=3, temperature=1.0)))
        await engine.pause()
        assert engine.status().waiting_requests == 1 and engine.status().running_requests == 1
        await hog.aclose()
        while engine.status().running_requests != 0:
            await asyncio.sleep(0.001)
        await engine.resume()
        [completion] = await queued
        assert len(completion.token_ids) == 3
    finally:
        await engine.stop()


async def test_pause_holds_running_requests_until_resume(engine):
    await engine.pause()
    request = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_tokens=4, temperature=0.0)))
    await asyncio.sleep(0.05)
    assert not request.done() and engine.status().paused
    await engine.resume()
    [completion] = await request
    assert len(completion.token_ids) == 4


async def test_a_full_queue_is_refused():
    engine = TorchEngine(
        tiny_model(), model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=1, max_waiting=2
    )
    await engine.start()
    try:
        await engine.pause()
        waiting = asyncio.create_task(engine.generate([5], SamplingParams(max_tokens=2, n=2)))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await engine.generate([5], SamplingParams(max_tokens=2))
        await engine.resume()
        assert len(await waiting) == 2
    finally:
        await engine.stop()


async def test_scores_equal_a_forward_pass(engine, model):
    tokens = [5, 6, 7, 8, 9, 10, 11]
    results = await asyncio.gather(engine.score(tokens, 2, 0.7), engine.score(tokens[:4], 1, 0.0))
    torch.testing.assert_close(
        torch.tensor(results[0].logprobs),
        recomputed_logprobs(model, tokens[:2], tokens[2:], 0.7),
        atol=1e-5,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.tensor(results[1].logprobs),
        recomputed_logprobs(model, tokens[:1], tokens[1:4], 1.0),
        atol=1e-5,
        rtol=0,
    )


async def test_scores_report_each_positions_most_likely_tokens_when_asked(engine, model):
    tokens = [5, 6, 7, 8, 9, 10, 11]
    asked, plain = await asyncio.gather(
        engine.score(tokens, 2, 0.7, top_logprobs=3), engine.score(tokens, 2, 0.7)
    )
    logits = full_forward(model, tokens)[1:-1] / 0.7
    expected = torch.log_softmax(logits, -1).topk(3, dim=-1)
    assert [[t for t, _ in top] for top in asked.top_logprobs] == expected.indices.tolist()
    torch.testing.assert_close(
        torch.tensor([[v for _, v in top] for top in asked.top_logprobs]), expected.values, atol=1e-5, rtol=0
    )
    assert asked.logprobs == plain.logprobs and plain.top_logprobs is None


async def test_stop_ends_open_requests_with_abort(model):
    engine = TorchEngine(
        model, model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=2, max_waiting=8
    )
    await engine.start()
    await engine.pause()
    request = asyncio.create_task(engine.generate([5, 6], SamplingParams(max_tokens=4, n=3)))
    await asyncio.sleep(0.01)
    await engine.stop()
    completions = await request
    assert [c.finish_reason for c in completions] == ["abort"] * 3


async def test_a_failing_step_fails_its_requests_loudly_and_the_engine_carries_on(engine):
    def broken(module, args):
        raise RuntimeError("lm_head exploded")

    hook = engine.model.lm_head.register_forward_pre_hook(broken)
    try:
        with pytest.raises(RuntimeError, match="lm_head exploded"):
            await engine.generate([5, 6], SamplingParams(max_tokens=4, n=2))
    finally:
        hook.remove()
    assert engine.status().running_requests == 0
    [completion] = await engine.generate([5, 6], SamplingParams(max_tokens=4))
    assert len(completion.token_ids) == 4


async def test_metrics_count_tokens_completions_and_the_version(engine):
    def value(name, labels=None):
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    before = {
        "generated": value("rlrun_inference_generated_tokens_total"),
        "prompt": value("rlrun_inference_prompt_tokens_total"),
        "length": value("rlrun_inference_completions_total", {"finish_reason": "length"}),
        "ttft": value("rlrun_inference_time_to_first_token_seconds_count"),
    }
    await engine.generate([5, 6, 7], SamplingParams(max_tokens=5, temperature=1.0, n=2))
    assert value("rlrun_inference_generated_tokens_total") - before["generated"] == 10
    assert value("rlrun_inference_prompt_tokens_total") - before["prompt"] == 6
    assert value("rlrun_inference_completions_total", {"finish_reason": "length"}) - before["length"] == 2
    assert value("rlrun_inference_time_to_first_token_seconds_count") - before["ttft"] == 2
    await engine.update_weights({k: v.clone() for k, v in engine.weight_specs().items()}, version=6)
    assert value("rlrun_inference_policy_version") == 6


async def test_first_tokens_follow_the_models_distribution(model):
    with torch.no_grad():
        model.lm_head.weight.mul_(60)  # a peaked distribution, so that a wrong sampler shows
    engine = TorchEngine(
        model, model_name="tiny", max_model_len=MAX_MODEL_LEN, max_batch_size=64, max_waiting=4096, seed=0
    )
    await engine.start()
    try:
        prompt = [3, 70, 71, 72, 1, 4]
        results = await asyncio.gather(
            *[engine.generate(prompt, SamplingParams(max_tokens=1, n=8)) for _ in range(500)]
        )
    finally:
        await engine.stop()
    counts = torch.bincount(
        torch.tensor([c.token_ids[0] for r in results for c in r]), minlength=model.config.vocab_size
    )
    expected = torch.softmax(full_forward(model, prompt)[-1], -1)
    torch.testing.assert_close(counts / counts.sum(), expected, atol=0.03, rtol=0)


async def test_constrained_samples_write_matching_json_with_logprobs_under_the_mask(model):
    """Every sample is JSON of the schema, ends with the token that completes it, and each
    token's logprob is under the tempered distribution with the grammar's mask applied
    (replayed through a grammar of its own)."""
    tokenizer = CharTokenizer.from_file(REPO / "configs/tokenizer/char")
    grammars = GrammarCompiler(lambda: tokenizer)
    engine = TorchEngine(
        model,
        model_name="tiny",
        max_model_len=MAX_MODEL_LEN,
        max_batch_size=8,
        max_waiting=64,
        seed=0,
        grammars=grammars,
    )
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["paris", "rome"]}, "open": {"type": "boolean"}},
        "required": ["city", "open"],
        "additionalProperties": False,
    }
    constrained = knobbed(max_tokens=40, temperature=0.9, n=3, json_schema=json.dumps(schema))
    free = SamplingParams(max_tokens=40, temperature=0.9)
    await engine.start()
    try:
        both = await asyncio.gather(
            engine.generate(PROMPTS[1], constrained),
            engine.generate(PROMPTS[1], replace(constrained, temperature=0.0, n=1)),
            engine.generate(PROMPTS[1], free),
        )
    finally:
        await engine.stop()
    sampled, [greedy], [unconstrained] = both
    for completion, temperature in [*((c, 0.9) for c in sampled), (greedy, 1.0)]:
        value = json.loads(tokenizer.decode(completion.token_ids))
        assert value["city"] in ("paris", "rome") and isinstance(value["open"], bool)
        assert completion.finish_reason == "stop"
        logits = full_forward(model, PROMPTS[1] + completion.token_ids)[len(PROMPTS[1]) - 1 : -1]
        replay = grammars.sample_grammar(json.dumps(schema))
        masked = reference_sampling.grammar_masked_logits(logits, completion.token_ids, replay)
        expected = torch.log_softmax(masked / temperature, -1).gather(
            1, torch.tensor(completion.token_ids)[:, None]
        )
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected[:, 0], atol=1e-4, rtol=0)
    # The model alone writes no JSON: the constraint, not chance, made the samples above.
    assert not tokenizer.decode(unconstrained.token_ids).startswith('{"city": ')
