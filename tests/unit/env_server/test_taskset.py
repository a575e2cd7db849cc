from __future__ import annotations

import random

import pytest

from rlrun.env_server.sdk.task import Example
from rlrun.env_server.sdk.taskset import GeneratedTaskset, in_eval_bucket


def letters(rng: random.Random) -> Example:
    text = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8)))
    return Example(key=text, prompt=text, data={"text": text})


def test_tasks_are_a_pure_function_of_seed_split_and_index():
    a, b, other = (
        GeneratedTaskset(letters, seed=1),
        GeneratedTaskset(letters, seed=1),
        GeneratedTaskset(letters, seed=2),
    )
    for split, idx in [("train", 0), ("train", 999_999), ("eval", 0), ("eval", 255)]:
        assert a.get(split, idx) == b.get(split, idx)
    assert [a.get("train", i).prompt for i in range(20)] != [other.get("train", i).prompt for i in range(20)]


def test_eval_is_fixed_distinct_and_disjoint_from_train():
    tasks = GeneratedTaskset(letters, seed=0, eval_size=256)
    assert tasks.sizes == {"train": 1_000_000, "eval": 256}
    held_out = {tasks.get("eval", i).example_id for i in range(256)}
    assert len(held_out) == 256
    assert all(in_eval_bucket(key, 16) for key in held_out)
    train = {tasks.get("train", i).example_id for i in range(5000)}
    assert not train & held_out


def test_a_task_carries_its_example():
    task = GeneratedTaskset(letters, seed=0).get("train", 42)
    assert (task.split, task.idx) == ("train", 42)
    assert task.example_id == task.prompt == task.data["text"]


@pytest.mark.parametrize(
    ("split", "idx", "error"),
    [
        ("train", 1_000_000, IndexError),
        ("train", -1, IndexError),
        ("eval", 256, IndexError),
        ("eval", -1, IndexError),
        ("test", 0, KeyError),
    ],
)
def test_lookups_outside_the_taskset_fail(split, idx, error):
    with pytest.raises(error):
        GeneratedTaskset(letters).get(split, idx)


def test_a_generator_too_small_for_the_eval_split_fails_loudly():
    def tiny(rng):
        key = str(rng.randint(0, 9))
        return Example(key=key, prompt=key, data={})

    with pytest.raises(ValueError, match="distinct eval examples"):
        GeneratedTaskset(tiny, eval_size=256)
