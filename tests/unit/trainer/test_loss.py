"""The loss on hand-computed tiny examples (DESIGN §4)."""

from __future__ import annotations

import math

import pytest
import torch

from rlrun.common.config.trainer import LossConfig
from rlrun.trainer.loss import STAT_NAMES, channel_loss, summarize, token_logprobs

SETTINGS = LossConfig(high=0.2, low=0.2, kl_coef=1e-3)


def rl_terms(
    pi: list[float],
    mu: list[float],
    advantages: list[float],
    mask: list[bool] | None = None,
    n_rl: int | None = None,
    settings: LossConfig = SETTINGS,
):
    logprobs = torch.tensor([math.log(p) for p in pi], dtype=torch.float64, requires_grad=True)
    n = len(pi)
    mask_t = torch.tensor(mask if mask is not None else [True] * n)
    terms = channel_loss(
        logprobs,
        torch.zeros(n, dtype=torch.float64),
        torch.tensor([math.log(m) for m in mu], dtype=torch.float64),
        torch.tensor(advantages, dtype=torch.float64),
        mask_t,
        torch.zeros(n, dtype=torch.float64),
        torch.zeros(n, dtype=torch.bool),
        n_rl if n_rl is not None else int(mask_t.sum()),
        0,
        settings,
    )
    return logprobs, terms


def stat(terms, name: str) -> float:
    return float(terms.stats[STAT_NAMES.index(name)])


def test_token_logprobs_divide_logits_by_each_rows_temperature():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    logprobs, entropy = token_logprobs(logits, torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))
    assert logprobs[0].item() == pytest.approx(math.log(3 / 4))
    # At temperature 2 the logits become [0, ln(3)/2]: p = sqrt(3) / (1 + sqrt(3)).
    assert logprobs[1].item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))
    p = 0.75
    assert entropy[0].item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)))


def test_rl_token_within_the_band_is_minus_advantage_times_ratio_plus_kl():
    logprobs, terms = rl_terms(pi=[0.5], mu=[0.4], advantages=[2.0])
    r = 0.5 / 0.4
    assert terms.loss.item() == pytest.approx(-2.0 * r + 1e-3 * math.log(r) ** 2)
    terms.loss.backward()
    # The policy gradient flows through r: d(-A r)/d log π = -A r.
    assert logprobs.grad.item() == pytest.approx(-2.0 * r + 2e-3 * math.log(r))


def test_entropy_bonus_rewards_a_flatter_distribution_on_rl_tokens_only():
    logits = torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    logprobs, entropy = token_logprobs(logits, torch.tensor([0, 0]), torch.ones(2, dtype=torch.float64))
    settings = LossConfig(high=0.2, low=0.2, kl_coef=0.0, entropy_coef=0.1)
    terms = channel_loss(
        logprobs,
        entropy,
        logprobs.detach(),
        torch.zeros(2, dtype=torch.float64),
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.bool),
        1,
        0,
        settings,
    )
    assert terms.loss.item() == pytest.approx(-0.1 * entropy[0].item())
    terms.loss.backward()
    # Descending the loss lowers the favoured logit of the rl row; the other row is untouched.
    assert logits.grad[0, 0].item() > 0
    assert torch.equal(logits.grad[1], torch.zeros(3, dtype=torch.float64))


def test_positive_advantage_masks_tokens_whose_probability_rose_past_high():
    logprobs, terms = rl_terms(pi=[0.7], mu=[0.4], advantages=[1.0])
    r = 0.7 / 0.4
    # Only the KL penalty is left; it still pulls π back toward μ.
    assert terms.loss.item() == pytest.approx(1e-3 * math.log(r) ** 2)
    assert stat(terms, "masked_high_count") == 1 and stat(terms, "masked_low_count") == 0
    terms.loss.backward()
    assert logprobs.grad.item() == pytest.approx(2e-3 * math.log(r))


def test_negative_advantage_is_not_masked_on_the_high_side():
    _, terms = rl_terms(pi=[0.7], mu=[0.4], advantages=[-1.0])
    r = 0.7 / 0.4
    assert terms.loss.item() == pytest.approx(r + 1e-3 * math.log(r) ** 2)
    assert stat(terms, "masked_high_count") == 0 and stat(terms, "masked_low_count") == 0


def test_negative_advantage_masks_tokens_whose_probability_fell_past_low():
    _, terms = rl_terms(pi=[0.1], mu=[0.4], advantages=[-1.0])
    assert terms.loss.item() == pytest.approx(1e-3 * math.log(0.25) ** 2)
    assert stat(terms, "masked_low_count") == 1 and stat(terms, "masked_high_count") == 0


def test_positive_advantage_is_not_masked_on_the_low_side():
    _, terms = rl_terms(pi=[0.1], mu=[0.4], advantages=[1.0])
    assert terms.loss.item() == pytest.approx(-0.25 + 1e-3 * math.log(0.25) ** 2)
    assert stat(terms, "masked_low_count") == 0


def test_zero_advantage_takes_the_low_side_rule():
    _, terms = rl_terms(pi=[0.1, 0.7], mu=[0.4, 0.4], advantages=[0.0, 0.0])
    assert stat(terms, "masked_low_count") == 1 and stat(terms, "masked_high_count") == 0


def test_the_thresholds_come_from_the_settings():
    _, loose = rl_terms(
        pi=[0.7], mu=[0.4], advantages=[1.0], settings=LossConfig(high=0.5, low=0.2, kl_coef=0.0)
    )
    assert loose.loss.item() == pytest.approx(-0.7 / 0.4)


def test_masked_out_tokens_add_nothing_even_with_a_meaningless_sampling_logprob():
    logprobs = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)).requires_grad_()
    terms = channel_loss(
        logprobs,
        torch.zeros(2, dtype=torch.float64),
        torch.tensor([math.log(0.4), -1e300], dtype=torch.float64),
        torch.tensor([1.0, 5.0], dtype=torch.float64),
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.bool),
        1,
        0,
        SETTINGS,
    )
    assert math.isfinite(terms.loss.item())
    assert terms.loss.item() == pytest.approx(-1.25 + 1e-3 * math.log(1.25) ** 2)


def test_ce_is_weighted_negative_log_likelihood():
    logprobs = torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64)).requires_grad_()
    terms = channel_loss(
        logprobs,
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.bool),
        torch.tensor([1.0, 2.0], dtype=torch.float64),
        torch.tensor([True, True]),
        0,
        2,
        SETTINGS,
    )
    assert terms.loss.item() == pytest.approx((math.log(2) + 2 * math.log(4)) / 2)


def test_each_channel_is_normalized_by_its_own_batch_wide_count():
    # One micro-batch's tokens; the batch has 4 rl tokens and 2 ce tokens in all (other ranks
    # and micro-batches hold the rest), so each sum is divided by its own batch-wide count.
    logprobs = torch.log(torch.tensor([0.5, 0.5, 0.25], dtype=torch.float64)).requires_grad_()
    terms = channel_loss(
        logprobs,
        torch.zeros(3, dtype=torch.float64),
        torch.log(torch.tensor([0.5, 0.5, 1.0], dtype=torch.float64)),
        torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64),
        torch.tensor([True, True, False]),
        torch.tensor([0.0, 0.0, 3.0], dtype=torch.float64),
        torch.tensor([False, False, True]),
        4,
        2,
        SETTINGS,
    )
    rl_sum = -1.0 + 1.0  # r = 1 on both rl tokens
    ce_sum = 3.0 * math.log(4)
    assert terms.loss.item() == pytest.approx(rl_sum / 4 + ce_sum / 2)
    metrics = summarize(terms.stats, n_rl=4, n_ce=2, n_trained=6)
    assert metrics["loss_ce"] == pytest.approx(ce_sum / 2)
    assert metrics["loss_rl"] == pytest.approx(0.0)


def test_summary_reports_mismatch_kl_and_masked_fractions_per_rl_token():
    _, terms = rl_terms(pi=[0.5, 0.7, 0.1, 0.4], mu=[0.4, 0.4, 0.4, 0.4], advantages=[1.0, 1.0, -1.0, 1.0])
    metrics = summarize(terms.stats, n_rl=4, n_ce=0, n_trained=4)
    ratios = [0.5 / 0.4, 0.7 / 0.4, 0.1 / 0.4, 1.0]
    assert metrics["mismatch_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 4)
    assert metrics["masked_frac_high"] == pytest.approx(0.25)
    assert metrics["masked_frac_low"] == pytest.approx(0.25)


def test_a_micro_batch_with_nothing_to_train_still_backpropagates_zeros():
    weight = torch.ones(3, requires_grad=True)
    logits = weight[None, :] * torch.tensor([[0.1, 0.2, 0.3]])
    logprobs, entropy = token_logprobs(logits, torch.tensor([2]), torch.tensor([1.0]))
    terms = channel_loss(
        logprobs,
        entropy,
        torch.zeros(1),
        torch.zeros(1),
        torch.tensor([False]),
        torch.zeros(1),
        torch.tensor([False]),
        0,
        0,
        SETTINGS,
    )
    terms.loss.backward()
    assert terms.loss.item() == 0.0
    assert torch.equal(weight.grad, torch.zeros(3))
