"""Bounded staleness, as pure decisions.

Versions count trainer updates. A group generated under policy version `start` that would be
trained by the batch the trainer receives at version `target` lags `target - start` versions;
it trains only when that lag is at most `max_off_policy_steps` (0 = synchronous). A group is
dropped whole, never partially.

The scheduler keeps just enough groups in flight: new groups are dispatched under the current
version `current`, so they can serve every batch whose target is at most
`current + max_off_policy_steps`. With the default of 1 that keeps generation exactly one step
ahead of training; with 0 nothing is dispatched while a batch trains.
"""

from __future__ import annotations


def off_policy_lag(target_version: int, policy_start: int) -> int:
    return target_version - policy_start


def is_stale(policy_start: int, target_version: int, max_off_policy_steps: int) -> bool:
    return off_policy_lag(target_version, policy_start) > max_off_policy_steps


def batches_ahead(current_version: int, target_version: int, max_off_policy_steps: int) -> int:
    """Batches, from the one being collected (trained at `target_version`) on, that groups
    dispatched now may still serve."""
    return max(0, current_version + max_off_policy_steps - target_version + 1)


def groups_to_dispatch(
    *,
    current_version: int,
    target_version: int,
    max_off_policy_steps: int,
    batch_size: int,
    taken: int,
    pending: int,
    inflight: int,
    inflight_limit: int,
) -> int:
    """How many new groups to dispatch now: what the servable batches still need beyond the
    groups already taken for the current batch and those pending (ready or in flight), capped
    by the room under the in-flight bound."""
    wanted = (
        batches_ahead(current_version, target_version, max_off_policy_steps) * batch_size - taken - pending
    )
    return max(0, min(wanted, inflight_limit - inflight))
