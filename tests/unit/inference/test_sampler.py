"""The batched sampler: greedy rows, logprob semantics, truncation, seeded rows, and the
distribution it actually draws from."""

import torch

from rlrun.inference.sampler import BatchSampler, RowSettings, truncate


def logits_rows(rows: int, vocab: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_rows_take_the_argmax_and_report_the_temperature_one_logprob():
    logits = logits_rows(3)
    tokens, logprobs, _ = BatchSampler([RowSettings(0.0)] * 3).sample(
        logits, torch.Generator().manual_seed(1)
    )
    assert tokens.tolist() == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected)


def test_sampled_logprobs_are_under_the_tempered_distribution_renormalised_over_what_truncation_kept():
    logits = logits_rows(4)
    rows = [
        RowSettings(0.7),
        RowSettings(1.3, top_k=3),
        RowSettings(0.5, top_p=0.8),
        RowSettings(0.0, top_k=1),
    ]
    tokens, logprobs, _ = BatchSampler(rows).sample(logits, torch.Generator().manual_seed(2))
    temperatures = torch.tensor([0.7, 1.3, 0.5, 1.0])[:, None]
    probs = torch.softmax(logits / temperatures, -1)
    kept = torch.ones_like(probs, dtype=torch.bool)
    kept[1] = probs[1] >= probs[1].topk(3).values[-1]
    ordered = probs[2].sort(descending=True)
    nucleus = ordered.indices[: int((ordered.values.cumsum(0) < 0.8).sum()) + 1]
    kept[2] = False
    kept[2, nucleus] = True
    assert 1 < kept[2].sum() < kept.shape[1]
    # The greedy row reports the model's own distribution, untruncated by its top_k.
    expected = (probs / (probs * kept).sum(-1, keepdim=True)).log().gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected)
    assert tokens[3] == logits[3].argmax()
    assert kept.gather(1, tokens[:, None]).all()


def test_truncate_keeps_the_top_k_then_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.2, 0.1]]))
    kept = truncate(logits, top_k=torch.tensor([2, 0, 0]), top_p=torch.tensor([1.0, 0.7, 1.0])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True, True, False, False], [True, True, True, True]]


def test_min_p_keeps_the_tokens_at_least_that_share_of_the_most_likely_before_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    kept = truncate(
        logits,
        top_k=torch.tensor([0, 0, 1]),
        top_p=torch.tensor([1.0, 0.9, 1.0]),
        min_p=torch.tensor([0.25, 0.5, 0.0]),
    ).isfinite()
    # 0.15 >= 0.25 * 0.5 stays; with min_p 0.5 only 0.5 and 0.3 remain, and the nucleus of
    # what is left (0.625, 0.375) needs both; min_p 0 keeps all for top-k.
    assert kept.tolist() == [
        [True, True, True, False],
        [True, True, False, False],
        [True, False, False, False],
    ]


def test_min_p_draws_only_from_tokens_that_likely_after_temperature():
    logits = logits_rows(1, vocab=30).expand(2000, 30)
    tokens, logprobs, _ = BatchSampler([RowSettings(1.5, min_p=0.1)] * 2000).sample(
        logits, torch.Generator().manual_seed(5)
    )
    probs = torch.softmax(logits[0] / 1.5, -1)
    allowed = (probs >= 0.1 * probs.max()).nonzero()[:, 0].tolist()
    assert len(allowed) > 1
    assert set(tokens.tolist()) == set(allowed)
    # The logprobs are those of the distribution drawn from: the tempered one over the
    # tokens min-p kept.
    torch.testing.assert_close(logprobs, (probs / probs[allowed].sum()).log()[tokens])


def test_truncation_always_keeps_the_most_likely_token():
    logits = logits_rows(2)
    kept = truncate(logits, top_k=torch.tensor([0, 1]), top_p=torch.tensor([1e-6, 1.0])).isfinite()
    assert kept.sum(-1).tolist() == [1, 1]
    assert kept.float().argmax(-1).tolist() == logits.argmax(-1).tolist()


def test_draws_follow_the_tempered_distribution():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    draws = 20000
    sampler = BatchSampler([RowSettings(2.0)] * draws)
    tokens, _, _ = sampler.sample(logits.expand(draws, 3), torch.Generator().manual_seed(3))
    frequencies = torch.bincount(tokens, minlength=3).float() / draws
    torch.testing.assert_close(frequencies, torch.softmax(logits / 2.0, -1), atol=0.015, rtol=0)


def test_top_k_draws_only_from_the_kept_tokens():
    logits = logits_rows(1, vocab=30).expand(500, 30)
    tokens, _, _ = BatchSampler([RowSettings(1.5, top_k=4)] * 500).sample(
        logits, torch.Generator().manual_seed(4)
    )
    assert set(tokens.tolist()) <= set(logits[0].topk(4).indices.tolist())


def test_seeded_rows_repeat_whatever_else_is_in_the_batch():
    logits = logits_rows(3, vocab=50)

    def seeded_draw(neighbours_seed: int) -> int:
        rows = [
            RowSettings(1.0),
            RowSettings(1.0, generator=torch.Generator().manual_seed(42)),
            RowSettings(1.0),
        ]
        tokens, _, _ = BatchSampler(rows).sample(logits, torch.Generator().manual_seed(neighbours_seed))
        return int(tokens[1])

    draws = {seeded_draw(seed) for seed in range(6)}
    assert len(draws) == 1


def test_a_zero_exponential_draw_never_picks_a_truncated_token(monkeypatch):
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])

    def zeros(self, generator=None):
        return self.fill_(0.0)

    monkeypatch.setattr(torch.Tensor, "exponential_", zeros)
    tokens, _, _ = BatchSampler([RowSettings(1.0, top_k=2)]).sample(logits, None)
    assert tokens.item() in (0, 1)


def test_a_sampler_of_rows_alike_does_not_depend_on_which_rows_it_samples():
    plain = RowSettings(0.7, top_logprobs=2)
    assert BatchSampler([plain] * 3).rows_alike == plain
    for rows in (
        [plain, RowSettings(0.8, top_logprobs=2)],
        [RowSettings(1.0, top_p=0.9)] * 2,
        [RowSettings(1.0, generator=torch.Generator())] * 2,
        [RowSettings(1.0, knobs={"logit_bias": {1: 2.0}})] * 2,
    ):
        assert BatchSampler(rows).rows_alike is None
