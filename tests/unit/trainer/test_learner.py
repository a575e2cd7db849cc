"""The train step: what changes after a batch, and what a skipped batch leaves untouched."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.model import PackedCausal
from rlrun.trainer.loss import channel_loss
from rlrun.trainer.packing import count_channel_tokens, pack_micro_batch
from rlrun.trainer.synthetic import synthetic_batch

METRIC_KEYS = {
    "loss",
    "loss_rl",
    "loss_ce",
    "grad_norm",
    "mismatch_kl",
    "masked_frac_low",
    "masked_frac_high",
    "entropy",
    "tokens",
    "step_seconds",
    "lr",
}


def params(learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def optimizer_state(learner) -> list[torch.Tensor]:
    return [
        v.clone() for s in learner.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    ]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_batch_moves_the_weights_and_bumps_step_and_version(make_learner):
    learner = make_learner()
    before = params(learner)
    result = learner.train(synthetic_batch(0))
    assert not result.skipped
    assert (result.step, result.version, learner.step, learner.version) == (1, 1, 1, 1)
    assert set(result.metrics) >= METRIC_KEYS
    assert not same(before, params(learner))


def test_several_grad_steps_per_batch_are_one_version(make_learner):
    one, two = make_learner(), make_learner(grad_steps_per_batch=2)
    batch = synthetic_batch(0)
    one.train(batch)
    result = two.train(batch)
    assert (result.step, result.version) == (1, 1)
    assert not same(params(one), params(two))
    assert next(iter(two.optimizer.state.values()))["step"].item() == 2


def test_a_batch_for_another_step_fails_loudly(make_learner):
    with pytest.raises(ValueError, match="batch.step 3"):
        make_learner().train(synthetic_batch(3))


def test_a_non_finite_loss_leaves_weights_optimizer_step_and_version_unchanged(make_learner):
    learner = make_learner()
    learner.train(synthetic_batch(0))
    weights, state = params(learner), optimizer_state(learner)
    batch = synthetic_batch(1)
    for s in batch.samples:  # finite on the wire, but exp(log π − log μ) overflows
        s.logprobs = [-1e38 if m else 0.0 for m in s.mask]
    result = learner.train(batch)
    assert result.skipped and "non-finite loss" in result.skip_reason
    assert (result.step, result.version, learner.step, learner.version) == (1, 1, 1, 1)
    assert same(weights, params(learner))
    assert same(state, optimizer_state(learner))
    assert all(p.grad is None for p in learner.model.parameters())


def test_a_later_grad_step_going_non_finite_undoes_the_earlier_ones(make_learner):
    learner = make_learner(grad_steps_per_batch=2)
    learner.train(synthetic_batch(0))
    weights, state = params(learner), optimizer_state(learner)
    # The first optimizer step at this learning rate blows the weights up; the second pass is NaN.
    result = learner.train(synthetic_batch(1, learning_rate=1e30))
    assert result.skipped and "optimizer step 2 of 2" in result.skip_reason
    assert learner.step == 1 and learner.version == 1
    assert same(weights, params(learner))
    assert same(state, optimizer_state(learner))
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(learner.scheduled_lr)
    assert not learner.train(synthetic_batch(1)).skipped


def test_a_batch_learning_rate_overrides_the_schedule_for_that_batch_only(make_learner):
    learner = make_learner(lr=1e-3, schedule={"kind": "linear", "total_steps": 10})
    first = learner.train(synthetic_batch(0, learning_rate=3e-3))
    second = learner.train(synthetic_batch(1))
    assert first.metrics["lr"] == pytest.approx(3e-3)
    assert second.metrics["lr"] == pytest.approx(1e-3 * 0.9)


def test_micro_batch_size_does_not_change_the_update(make_learner):
    whole, split = make_learner(), make_learner(micro_batch_tokens=48)
    batch = synthetic_batch(0)
    a, b = whole.train(batch), split.train(batch)
    assert a.metrics["micro_batches_per_rank"] == 1 and b.metrics["micro_batches_per_rank"] > 2
    assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], rel=1e-5)
    for x, y in zip(params(whole), params(split), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_full_weights_carry_hf_names_and_drop_a_tied_lm_head(make_learner):
    untied = make_learner().full_weights()
    tied = make_learner(model="tiny-d128").full_weights()
    assert "lm_head.weight" in untied and "model.embed_tokens.weight" in untied
    assert "lm_head.weight" not in tied and "model.norm.weight" in tied


@pytest.mark.parametrize("entropy_coef", [0.0, 0.05])
def test_the_update_equals_a_full_logits_reference_step(make_learner, entropy_coef):
    """The learner computes the head only on the rows that predict a token, and the entropy
    outside autograd when it has no coefficient: the same update as the plain step below,
    which takes every row's logits and differentiates everything."""
    learner = make_learner(loss={"entropy_coef": entropy_coef}, max_grad_norm=1e9)
    reference = make_learner(loss={"entropy_coef": entropy_coef}, max_grad_norm=1e9)
    batch = synthetic_batch(0)
    counts = count_channel_tokens(batch.samples)
    packed = pack_micro_batch(batch.samples)
    logits = reference.model(packed.input_ids, packed.positions, PackedCausal.from_offsets(packed.cu_seqlens))
    log_probs = torch.log_softmax(logits[packed.predict_rows].float() / packed.temperatures[:, None], dim=-1)
    logprobs = log_probs.gather(-1, packed.targets[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    terms = channel_loss(
        logprobs,
        entropy,
        packed.sampling_logprobs,
        packed.advantages,
        packed.rl_mask,
        packed.ce_weights,
        packed.ce_mask,
        counts.rl,
        counts.ce,
        reference.config.loss,
    )
    terms.loss.backward()
    reference.optimizer.step()
    result = learner.train(batch)
    assert result.metrics["loss"] == pytest.approx(terms.loss.item(), rel=1e-5)
    for x, y in zip(params(learner), params(reference), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
