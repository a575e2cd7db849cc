"""Traces to training samples: one TrainingSample per credited branch.

Per token, a sample's `mask` marks the model-sampled tokens the algorithms let train; the rl
channel applies there. The ce channel is a per-token weight and trains wherever it is
nonzero, so observation tokens (echo) train under CE without ever entering the rl channel.
Tokens of a node that failed to parse never train, and a node shared by several branches
trains only in the first branch that emits a sample. Logprobs are the sampling-time ones (0
where not sampled); the member's temperature is fanned out over every token; channels with
the same loss are summed into one.
"""

from __future__ import annotations

import operator

from rlrun.common.wire.trace import Branch, Channel, MessageNode, Trace
from rlrun.common.wire.training import TrainingSample


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


def eligible_tokens(
    branch: Branch, nodes: dict[str, MessageNode], done: set[str]
) -> tuple[list[bool], list[bool]]:
    """(sampled and trainable, trainable) per token: a token is trainable unless its node failed
    to parse or already trained in an earlier branch."""
    sampled: list[bool] = []
    trainable: list[bool] = []
    for nid in branch.node_ids:
        node = nodes[nid]
        n = len(node.token_ids)
        if nid in done or node.parse_error:
            sampled += [False] * n
            trainable += [False] * n
        else:
            sampled += node.sampled_mask
            trainable += [True] * n
    return sampled, trainable


def flatten_trace(trace: Trace, temperature: float) -> list[TrainingSample]:
    if temperature <= 0:
        raise ValueError(f"the fanned-out temperature must be positive, got {temperature}")
    nodes = trace.node_map()
    done: set[str] = set()
    samples: list[TrainingSample] = []
    for index, branch in enumerate(trace.branches):
        if not branch.mask:
            continue
        sampled, trainable = eligible_tokens(branch, nodes, done)
        if len(branch.mask) != len(sampled):
            raise ValueError(
                f"trace {trace.id!r} branch {index}: mask has {len(branch.mask)} entries for {len(sampled)} tokens"
            )
        mask = list(map(operator.and_, branch.mask, sampled))
        allowed = list(map(operator.and_, branch.mask, trainable))
        channels = [
            Channel(
                c.loss,
                [
                    v if ok else 0.0
                    for v, ok in zip(c.values, mask if c.loss == "rl" else allowed, strict=True)
                ],
            )
            for c in merge_channels(branch.channels)
        ]
        if not any(mask) and not any(v for c in channels if c.loss == "ce" for v in c.values):
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
