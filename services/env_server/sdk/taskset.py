"""Tasksets: seeded and generated on demand, never downloaded."""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable

from rlrun.env_server.sdk.task import Example, Task

TRAIN = "train"
EVAL = "eval"

Draw = Callable[[random.Random], Example]
"""Draws one example from a seeded random generator."""


class Taskset(ABC):
    """Tasks by split and index. Implementations must be cheap to construct: the env-server
    builds one in its main process (to validate requests) and one in every worker."""

    @property
    @abstractmethod
    def sizes(self) -> dict[str, int]:
        """Number of tasks per split."""

    @abstractmethod
    def get(self, split: str, idx: int) -> Task:
        """The task at `idx` of `split`; raises KeyError / IndexError outside the taskset."""


def in_eval_bucket(key: str, buckets: int) -> bool:
    """Stable across processes and runs (unlike `hash`), so every worker agrees on the split."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets == 0


class GeneratedTaskset(Taskset):
    """A train and an eval split drawn from one generator, disjoint by construction.

    An example belongs to eval exactly when its key hashes into bucket 0 of `eval_buckets`.
    Eval is `eval_size` distinct such examples, drawn once from the stream seeded by
    (seed, "eval"). Train task `idx` is drawn on demand from the stream seeded by
    (seed, "train", idx), redrawing any example that falls into the eval bucket, so train
    never contains an eval example and the train split costs no memory however large it is.
    """

    def __init__(
        self,
        draw: Draw,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
        eval_buckets: int = 16,
        max_draws: int = 1000,
    ):
        if train_size < 1 or eval_size < 1:
            raise ValueError(f"split sizes must be positive, got train {train_size}, eval {eval_size}")
        if eval_buckets < 2:
            raise ValueError(f"eval_buckets must be >= 2, got {eval_buckets}")
        self.draw = draw
        self.seed = seed
        self.train_size = train_size
        self.eval_buckets = eval_buckets
        self.max_draws = max_draws
        self._eval = self._draw_eval(eval_size)

    @property
    def sizes(self) -> dict[str, int]:
        return {TRAIN: self.train_size, EVAL: len(self._eval)}

    def _draw_eval(self, size: int) -> list[Example]:
        rng = random.Random(f"{self.seed}:{EVAL}")
        examples: dict[str, Example] = {}
        fruitless = 0
        while fruitless < self.eval_buckets * self.max_draws:
            example = self.draw(rng)
            fruitless += 1
            if in_eval_bucket(example.key, self.eval_buckets) and example.key not in examples:
                examples[example.key] = example
                fruitless = 0
                if len(examples) == size:
                    return list(examples.values())
        raise ValueError(
            f"the generator yields only {len(examples)} distinct eval examples, fewer than {size}; "
            "widen the example space or lower eval_size"
        )

    def _draw_train(self, idx: int) -> Example:
        rng = random.Random(f"{self.seed}:{TRAIN}:{idx}")
        for _ in range(self.max_draws):
            example = self.draw(rng)
            if not in_eval_bucket(example.key, self.eval_buckets):
                return example
        raise ValueError(f"train task {idx}: {self.max_draws} draws all fell into the eval bucket")

    def get(self, split: str, idx: int) -> Task:
        sizes = self.sizes
        if split not in sizes:
            raise KeyError(f"unknown split {split!r}; expected one of {sorted(sizes)}")
        if not 0 <= idx < sizes[split]:
            raise IndexError(f"{split} task {idx} is outside [0, {sizes[split]})")
        example = self._draw_train(idx) if split == TRAIN else self._eval[idx]
        return Task.from_example(split, idx, example)
