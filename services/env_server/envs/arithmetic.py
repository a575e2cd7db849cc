"""arithmetic: integer arithmetic like `37+48`; the answer must match exactly."""

from __future__ import annotations

import operator
import random

from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.scoring import exact_match
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class Arithmetic(Environment):
    def __init__(
        self,
        max_operand: int = 99,
        ops: str = "+-",
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
    ):
        if max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {max_operand}")
        if not ops or any(op not in OPERATORS for op in ops):
            raise ValueError(f"ops must be a non-empty string of {''.join(OPERATORS)}, got {ops!r}")

        def draw(rng: random.Random) -> Example:
            a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
            problem = f"{a}{op}{b}"
            return Example(
                key=problem, prompt=problem, data={"problem": problem, "answer": str(OPERATORS[op](a, b))}
            )

        self.taskset = GeneratedTaskset(draw, seed, train_size, eval_size)
        self.harness = SingleTurnHarness()

    def score(self, task: Task, episode: Episode) -> Score:
        return Score.of("correct", exact_match(episode.answer, task.data["answer"]))

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]
