"""The torch engine core's scoring: logprobs of given tokens (InferenceService.Score, and the
OpenAI API's echo), for many jobs in one packed forward pass."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import accumulate

import torch

from rlrun.common.model import CausalLM, PackedCausal
from rlrun.common.wire.inference import ScoreResult, TopLogprobs
from rlrun.inference.engines.core_protocol import DONE, FAILED, Score

log = logging.getLogger("rlrun.inference.engines.torch_core")


def score_batch(model: CausalLM, jobs: Sequence[Score], version: int, device: torch.device) -> list[tuple]:
    """One event per job: (DONE, rid, ScoreResult), or (FAILED, rid, error) for every job when
    the forward fails."""
    try:
        lengths = [len(job.token_ids) for job in jobs]
        offsets = list(accumulate(lengths, initial=0))
        ids = torch.tensor([t for job in jobs for t in job.token_ids], device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        attend = PackedCausal(lengths)
        # Row r predicts token r + 1; job i scores its tokens start .. len - 1.
        rows = [
            r
            for job, base in zip(jobs, offsets, strict=False)
            for r in range(base + job.start - 1, base + len(job.token_ids) - 1)
        ]
        temperatures = [job.temperature or 1.0 for job in jobs for _ in range(job.start, len(job.token_ids))]
        hidden = model.hidden_states(ids, positions, attend)
        row_index = torch.tensor(rows, device=device)
        logits = model.lm_head(hidden.index_select(0, row_index)).float()
        logits = logits / torch.tensor(temperatures, device=device)[:, None]
        distributions = torch.log_softmax(logits, dim=-1)
        logprobs = distributions.gather(1, ids[row_index + 1][:, None])[:, 0].tolist()
        most = max(job.top_logprobs for job in jobs)
        if most:
            top_values, top_ids = (t.tolist() for t in distributions.topk(min(most, logits.shape[-1])))
    except Exception as error:
        log.exception("score batch failed")
        return [(FAILED, job.rid, error) for job in jobs]
    events: list[tuple] = []
    cursor = 0
    for job in jobs:
        count = len(job.token_ids) - job.start
        rows = range(cursor, cursor + count)
        top = None
        if job.top_logprobs:
            top = [top_entries(top_values[r], top_ids[r], job.top_logprobs) for r in rows]
        events.append((DONE, job.rid, ScoreResult(logprobs[cursor : cursor + count], version, top)))
        cursor += count
    return events


def top_entries(values: list[float], token_ids: list[int], count: int) -> TopLogprobs:
    """One position's `count` most likely tokens, from the batch's top-k (k >= count)."""
    return list(zip(token_ids[:count], values[:count], strict=True))
