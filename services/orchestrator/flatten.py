"""Traces to training samples: one TrainingSample per credited branch.

Per token, a sample trains (mask) where the algorithms' mask says so and the token is
trainable: sampled by the model, or an observation token that carries a CE weight (echo).
Tokens of a node that failed to parse never train, and a node shared by several branches
trains only in the first branch that emits a sample. Logprobs are the sampling-time ones (0
where not sampled); the member's temperature is fanned out over every token; channels with
the same loss are summed into one.
"""

from __future__ import annotations

import operator

from rlrun.common.types import Branch, Channel, MessageNode, Trace, TrainingSample


def merge_channels(channels: list[Channel]) -> list[Channel]:
    by_loss: dict[str, list[float]] = {}
    for channel in channels:
        current = by_loss.get(channel.loss)
        by_loss[channel.loss] = (
            list(channel.values)
            if current is None
            else [a + b for a, b in zip(current, channel.values, strict=True)]
        )
    return [Channel(loss, values) for loss, values in by_loss.items()]  # type: ignore[arg-type]


def trainable_tokens(
    branch: Branch, nodes: dict[str, MessageNode], ce: list[float] | None, done: set[str]
) -> list[bool]:
    out: list[bool] = []
    for nid in branch.node_ids:
        node = nodes[nid]
        n = len(node.token_ids)
        if nid in done or node.parse_error:
            out += [False] * n
        elif node.is_observation and ce is not None:
            start = len(out)
            out += [s or ce[start + i] != 0.0 for i, s in enumerate(node.sampled_mask)]
        else:
            out += node.sampled_mask
    return out


def flatten_trace(trace: Trace, temperature: float) -> list[TrainingSample]:
    if temperature <= 0:
        raise ValueError(f"the fanned-out temperature must be positive, got {temperature}")
    nodes = trace.node_map()
    done: set[str] = set()
    samples: list[TrainingSample] = []
    for index, branch in enumerate(trace.branches):
        if not branch.mask:
            continue
        channels = merge_channels(branch.channels)
        ce = next((c.values for c in channels if c.loss == "ce"), None)
        eligible = trainable_tokens(branch, nodes, ce, done)
        if len(branch.mask) != len(eligible):
            raise ValueError(
                f"trace {trace.id!r} branch {index}: mask has {len(branch.mask)} entries for {len(eligible)} tokens"
            )
        mask = list(map(operator.and_, branch.mask, eligible))
        if not any(mask):
            continue
        done.update(branch.node_ids)
        tokens = trace.branch_tokens(index, nodes)
        samples.append(
            TrainingSample(
                token_ids=tokens.token_ids,
                mask=mask,
                logprobs=tokens.logprobs,
                temperatures=[temperature] * len(tokens.token_ids),
                channels=channels,
            )
        )
    return samples
