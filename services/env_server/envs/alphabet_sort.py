"""alphabet-sort: write the given letters in alphabetical order. The prompt is just the letters.

Single-turn by default (`max_turns = 1`). With `max_turns > 1` it is multi-turn: after a wrong
answer the env replies, as a user message, how many letters are in place (`2/5`), and the
model tries again. With `rewrite_history`, each retry forks from the prompt instead, and the
feedback quotes the failed attempt (`bcda 2/4`).

Rewards: `similarity` (1 − normalised Levenshtein distance to the sorted letters, weight 1)
and, multi-turn, `extra_turns` (turns beyond the first, weight −turn_penalty).
"""

from __future__ import annotations

import random
import string

from rlrun.common.wire.trace import RewardComponent
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import MultiTurnHarness, SingleTurnHarness
from rlrun.env_server.sdk.scoring import similarity
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset


class AlphabetSort(Environment):
    def __init__(
        self,
        min_len: int = 3,
        max_len: int = 6,
        max_turns: int = 1,
        rewrite_history: bool = False,
        turn_penalty: float = 0.1,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
    ):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")

        def draw(rng: random.Random) -> Example:
            text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(min_len, max_len)))
            return Example(key=text, prompt=text, data={"text": text, "answer": "".join(sorted(text))})

        self.taskset = GeneratedTaskset(draw, seed, train_size, eval_size)
        self.max_turns = max_turns
        self.rewrite_history = rewrite_history
        self.turn_penalty = turn_penalty
        self.harness = (
            SingleTurnHarness()
            if max_turns == 1
            else MultiTurnHarness(self.feedback, max_turns=max_turns, rewrite_history=rewrite_history)
        )

    def feedback(self, task: Task, episode: Episode) -> str | None:
        answer, target = episode.answer, task.data["answer"]
        if answer == target:
            return None
        in_place = f"{sum(a == b for a, b in zip(answer, target, strict=False))}/{len(target)}"
        return f"{answer} {in_place}" if self.rewrite_history else in_place

    def score(self, task: Task, episode: Episode) -> Score:
        rewards = {"similarity": RewardComponent(similarity(episode.answer, task.data["answer"]), 1.0)}
        if self.max_turns > 1:
            rewards["extra_turns"] = RewardComponent(episode.metrics["turns"] - 1, -self.turn_penalty)
        return Score(rewards)

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]
