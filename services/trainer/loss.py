"""The trainer's loss (pure tensor math, DESIGN §4).

    L = sum(L_rl) / N_rl + sum(L_ce) / N_ce

N is that channel's count of masked-in tokens over the whole batch (all ranks), so a
micro-batch's loss is its own token sum over the global N, and summing micro-batches (and
ranks) gives L exactly.

Per token, with π the trainer's probability of the token (logits divided by the token's
sampling temperature) and μ its probability when it was sampled:

- rl: r = exp(log π − log μ); loss = −A·r (the policy gradient flows through r), dropped on
  tokens whose probability moved too far on the side that would amplify the update (A > 0 and
  π − μ > high, or A ≤ 0 and π − μ < −low), plus kl_coef·(log r)², which keeps π near μ and is
  applied to every rl token, masked ones included (that is where it matters most), minus
  entropy_coef·H(π) (an entropy bonus; 0 unless configured).
- ce: loss = −w·log π (weighted NLL: sft, echo).

Everything is written with multiplications and `where` rather than boolean indexing, so a
micro-batch with no trained tokens still has a (zero) gradient path to every parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlrun.common.config.trainer import LossConfig

# Order of the statistics a micro-batch sums; ranks all-reduce them as one tensor.
STAT_NAMES = (
    "loss_rl_sum",
    "loss_ce_sum",
    "mismatch_kl_sum",
    "masked_low_count",
    "masked_high_count",
    "entropy_sum",
)


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperatures: torch.Tensor, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π of each target and the entropy of each row's distribution, both after dividing
    the row's logits by its temperature. logits: [P, V]; targets, temperatures: [P].

    `entropy_grad=False` (no entropy bonus): the entropy is a statistic only, computed
    outside autograd, so the backward pass does not go over [P, V] a second time for a term
    whose coefficient is 0."""
    scaled = logits.float() / temperatures[:, None]
    log_probs = torch.log_softmax(scaled, dim=-1)
    chosen = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


@dataclass(frozen=True)
class LossTerms:
    """A micro-batch's contribution: `loss` to backpropagate, and `stats` ([len(STAT_NAMES)],
    detached sums) to all-reduce and divide by the batch's token counts."""

    loss: torch.Tensor
    stats: torch.Tensor


def channel_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    rl_mask: torch.Tensor,
    ce_weights: torch.Tensor,
    ce_mask: torch.Tensor,
    n_rl: int,
    n_ce: int,
    settings: LossConfig,
) -> LossTerms:
    """All inputs are per prediction row [P]; n_rl and n_ce are the batch-wide counts."""
    rl = rl_mask.to(logprobs.dtype)
    ce = ce_mask.to(logprobs.dtype)
    # Zero the log-ratio off the rl tokens so a meaningless μ (0 where not sampled) can never
    # turn into inf * 0 = nan.
    log_ratio = torch.where(rl_mask, logprobs - sampling_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        moved = logprobs.exp() - sampling_logprobs.exp()
        positive = advantages > 0
        masked_high = rl_mask & positive & (moved > settings.high)
        masked_low = rl_mask & ~positive & (moved < -settings.low)
        keep = rl * (~(masked_high | masked_low)).to(logprobs.dtype)
    rl_tokens = (
        -advantages * ratio * keep
        + settings.kl_coef * log_ratio.square() * rl
        - settings.entropy_coef * entropy * rl
    )
    ce_tokens = -ce_weights * logprobs * ce
    rl_sum, ce_sum = rl_tokens.sum(), ce_tokens.sum()
    loss = rl_sum / max(n_rl, 1) + ce_sum / max(n_ce, 1)
    with torch.no_grad():
        # k3 estimator of KL(μ ‖ π) on tokens sampled from μ: r − 1 − log r (>= 0).
        mismatch_kl = ((ratio - 1 - log_ratio) * rl).sum()
        trained = (rl_mask | ce_mask).to(logprobs.dtype)
        stats = torch.stack(
            [
                rl_sum.detach(),
                ce_sum.detach(),
                mismatch_kl,
                masked_low.sum().to(logprobs.dtype),
                masked_high.sum().to(logprobs.dtype),
                (entropy * trained).sum(),
            ]
        )
    return LossTerms(loss=loss, stats=stats)


def summarize(stats: torch.Tensor, n_rl: int, n_ce: int, n_trained: int) -> dict[str, float]:
    """Batch metrics from the all-reduced sums of `channel_loss`."""
    values = dict(zip(STAT_NAMES, stats.tolist(), strict=True))
    loss_rl = values["loss_rl_sum"] / max(n_rl, 1)
    loss_ce = values["loss_ce_sum"] / max(n_ce, 1)
    return {
        "loss": loss_rl + loss_ce,
        "loss_rl": loss_rl,
        "loss_ce": loss_ce,
        "mismatch_kl": values["mismatch_kl_sum"] / max(n_rl, 1),
        "masked_frac_low": values["masked_low_count"] / max(n_rl, 1),
        "masked_frac_high": values["masked_high_count"] / max(n_rl, 1),
        "entropy": values["entropy_sum"] / max(n_trained, 1),
    }
