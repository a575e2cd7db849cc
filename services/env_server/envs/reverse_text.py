"""reverse-text: reverse a string of lowercase letters. The prompt is just the letters.

Reward: 1 − normalised Levenshtein distance between the answer and the reversed string.
Env-owned algorithm `length_penalty`: group-relative advantages of rewards that lose
`length_penalty` × the relative gap between the answer's length and the target's.
"""

from __future__ import annotations

import json
import random
import string

from rlrun.common.wire.trace import Trace
from rlrun.env_server.sdk.algorithms import BranchResult, EnvAlgorithm, sampled_advantage
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.scoring import similarity
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset


class ReverseText(Environment):
    def __init__(
        self,
        min_len: int = 3,
        max_len: int = 8,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
        length_penalty: float = 0.1,
    ):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")

        def draw(rng: random.Random) -> Example:
            text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(min_len, max_len)))
            return Example(key=text, prompt=text, data={"text": text, "answer": text[::-1]})

        self.taskset = GeneratedTaskset(draw, seed, train_size, eval_size)
        self.harness = SingleTurnHarness()
        self.length_penalty = length_penalty

    def score(self, task: Task, episode: Episode) -> Score:
        return Score.of("similarity", similarity(episode.answer, task.data["answer"]))

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]

    def algorithms(self) -> dict[str, EnvAlgorithm]:
        return {"length_penalty": self.length_penalty_advantages}

    def length_penalty_advantages(self, traces: list[Trace]) -> list[BranchResult]:
        """A_i = r'_i − mean(r') with r'_i = reward_i − λ·|sampled_i − target| / target, where
        sampled_i counts the trace's sampled tokens and target = len(answer) + 1 (the stop
        token). Failed traces get no result."""
        scored = []
        for trace in traces:
            if trace.failed:
                continue
            target = len(json.loads(trace.task.data)["answer"]) + 1
            sampled = sum(node.num_sampled for node in trace.nodes)
            scored.append((trace, trace.reward - self.length_penalty * abs(sampled - target) / target))
        if not scored:
            return []
        baseline = sum(r for _, r in scored) / len(scored)
        return [
            sampled_advantage(trace, b, r - baseline)
            for trace, r in scored
            for b in range(len(trace.branches))
        ]
