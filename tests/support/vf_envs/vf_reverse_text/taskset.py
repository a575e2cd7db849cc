import random
import string

import verifiers.v1 as vf


class ReverseData(vf.TaskData):
    text: str
    answer: str


def lcs_similarity(a: str, b: str) -> float:
    """1 - normalised Levenshtein distance (1.0 for equal strings)."""
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1.0 - previous[-1] / max(len(a), len(b))


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        return lcs_similarity(trace.last_reply, self.data.answer)

    @vf.metric
    async def answer_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    min_len: int = 3
    max_len: int = 8
    seed: int = 0


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self) -> list[ReverseTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            text = "".join(
                rng.choices(string.ascii_lowercase, k=rng.randint(self.config.min_len, self.config.max_len))
            )
            tasks.append(
                ReverseTask(ReverseData(prompt=text, text=text, answer=text[::-1]), self.config.task)
            )
        return tasks
