"""Bounded staleness as pure decisions: what is stale, and how much to keep in flight."""

from __future__ import annotations

from rlrun.orchestrator.collect.staleness import batches_ahead, groups_to_dispatch, is_stale, off_policy_lag


def test_a_group_is_stale_beyond_max_off_policy_steps():
    assert off_policy_lag(target_version=5, policy_start=3) == 2
    assert not is_stale(policy_start=4, target_version=5, max_off_policy_steps=1)
    assert is_stale(policy_start=3, target_version=5, max_off_policy_steps=1)
    assert not is_stale(policy_start=5, target_version=5, max_off_policy_steps=0)
    assert is_stale(policy_start=4, target_version=5, max_off_policy_steps=0)


def dispatch(current, target, max_off, taken=0, pending=0, inflight=0, limit=100, batch=4):
    return groups_to_dispatch(
        current_version=current,
        target_version=target,
        max_off_policy_steps=max_off,
        batch_size=batch,
        taken=taken,
        pending=pending,
        inflight=inflight,
        inflight_limit=limit,
    )


def test_synchronous_runs_generate_nothing_while_a_batch_trains():
    # batch n trains at version 3; batch n+1 will train at 4 but must be generated at 4
    assert batches_ahead(current_version=3, target_version=4, max_off_policy_steps=0) == 0
    assert dispatch(current=3, target=4, max_off=0) == 0
    # training done: version 4, one batch to fill
    assert dispatch(current=4, target=4, max_off=0) == 4


def test_default_async_keeps_exactly_one_step_ahead():
    assert dispatch(current=3, target=4, max_off=1) == 4  # next batch generated during training
    assert dispatch(current=3, target=3, max_off=1) == 8  # nothing training: this batch and the next
    assert dispatch(current=3, target=4, max_off=1, taken=1, pending=3) == 0
    assert dispatch(current=3, target=4, max_off=1, taken=1, pending=2) == 1  # a group failed: replace it


def test_the_inflight_bound_caps_dispatch():
    assert dispatch(current=3, target=3, max_off=1, inflight=5, pending=5, limit=6) == 1
    assert dispatch(current=3, target=3, max_off=1, inflight=6, pending=6, limit=6) == 0
