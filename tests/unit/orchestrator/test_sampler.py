"""The task sampler: seeded, by ratio, never the dev set, resumable."""

from __future__ import annotations

from collections import Counter

import pytest

from rlrun.orchestrator.collect.sampler import EnvTasks, TaskSampler


def test_same_seed_same_stream_and_the_state_resumes_it():
    envs = [EnvTasks("a", 1.0, 100), EnvTasks("b", 3.0, 50)]
    first, second = TaskSampler(envs, seed=7), TaskSampler(envs, seed=7)
    assert [first.sample() for _ in range(20)] == [second.sample() for _ in range(20)]
    state = first.state()
    expected = [first.sample() for _ in range(10)]
    resumed = TaskSampler(envs, seed=999)
    resumed.load_state(state)
    assert [resumed.sample() for _ in range(10)] == expected


def test_ratios_and_held_out_dev_tasks():
    sampler = TaskSampler(
        [EnvTasks("a", 1.0, 20, first_index=10), EnvTasks("b", 3.0, 20, first_index=10)], seed=0
    )
    draws = [sampler.sample() for _ in range(4000)]
    counts = Counter(env for env, _ in draws)
    assert 0.7 < counts["b"] / len(draws) < 0.8
    assert min(idx for _, idx in draws) == 10 and max(idx for _, idx in draws) == 19


def test_a_dev_set_that_swallows_the_split_is_refused():
    with pytest.raises(ValueError, match="none left after holding out the first 64"):
        EnvTasks("tiny", 1.0, 64, first_index=64)
