"""code-sandbox: write a Python expression in `x`; the sandbox runs it against hidden tests.

A task is a short chain of steps drawn from a seed, e.g. the prompt `add 4 then times 3`, whose
reference answer is `(x+4)*3`. The answer (the last assistant message that is not a tool call)
becomes `solution.py` (`def f(x): return <answer>`) in the episode's sandbox, which evaluates
`f` on hidden inputs; the reward is the fraction of them where it returns what the chain does.
The expected values never enter the sandbox: the sandbox prints what `f` returned and the
worker compares, so code that prints cannot claim a pass. The inputs the model may try are in
`tests.py` (two of them, run by the `run_tests` tool), for a harness with tool calls.
"""

from __future__ import annotations

import json
import random

from rlrun.env_server.runtimes.local import LocalRuntime
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import SandboxToolHarness
from rlrun.env_server.sdk.sandbox import SandboxRuntime
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset

STEPS = {
    "add": lambda v, k: v + k,
    "minus": lambda v, k: v - k,
    "times": lambda v, k: v * k,
}
SYMBOLS = {"add": "+", "minus": "-", "times": "*"}

RUNNER = """\
import json, sys
cases = json.loads(sys.argv[1])
results = []
for x in cases:
    try:
        from solution import f
        results.append(repr(f(x)))
    except BaseException as error:
        results.append("error: " + type(error).__name__)
print(json.dumps(results))
"""
"""Prints, as the last line, what `f` returned for each input (never whether it passed)."""

VISIBLE_TESTS = """\
from solution import f
for x, want in {cases}:
    got = f(x)
    print(f"f({{x}}) = {{got!r}}, want {{want!r}}:", "ok" if got == want else "FAIL")
"""


def _chain(steps: list[tuple[str, int]], x: int) -> int:
    value = x
    for name, k in steps:
        value = STEPS[name](value, k)
    return value


def _expression(steps: list[tuple[str, int]]) -> str:
    text = "x"
    for i, (name, k) in enumerate(steps):
        text = f"{text}{SYMBOLS[name]}{k}"
        if i < len(steps) - 1 and name != "times" and steps[i + 1][0] == "times":
            text = f"({text})"
    return text


def solution_source(answer: str) -> str:
    return f"def f(x):\n    return ({answer.strip()})\n"


class CodeSandbox(Environment):
    def __init__(
        self,
        max_steps: int = 2,
        max_constant: int = 30,
        cases: int = 6,
        max_tool_calls: int = 0,
        runtime: SandboxRuntime | None = None,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
    ):
        if max_steps < 1 or max_constant < 1 or cases < 1:
            raise ValueError(
                f"max_steps, max_constant and cases must be >= 1, got {max_steps}, {max_constant}, {cases}"
            )

        def draw(rng: random.Random) -> Example:
            steps = [
                (rng.choice(list(STEPS)), rng.randint(1, max_constant))
                for _ in range(rng.randint(1, max_steps))
            ]
            prompt = " then ".join(f"{name} {k}" for name, k in steps)
            inputs = rng.sample(range(-20, 21), cases + 2)
            hidden, visible = inputs[:cases], inputs[cases:]
            return Example(
                key=prompt,
                prompt=prompt,
                data={
                    "answer": _expression(steps),
                    "hidden": [[x, _chain(steps, x)] for x in hidden],
                    "files": {
                        "tests.py": VISIBLE_TESTS.format(cases=[(x, _chain(steps, x)) for x in visible])
                    },
                    "run_tests": "python3 tests.py",
                },
            )

        self.taskset = GeneratedTaskset(draw, seed, train_size, eval_size)
        self.runtime = runtime or LocalRuntime(timeout_s=5.0, cpu_s=5, memory_mb=256)
        self.harness = SandboxToolHarness(self.runtime, self.grade, max_tool_calls=max_tool_calls)

    async def grade(self, task: Task, episode: Episode) -> None:
        """Runs the answer on the hidden inputs; `tests_passed` and `tests_total` are what
        `score` reads."""
        assert episode.sandbox is not None
        hidden = task.data["hidden"]
        await episode.sandbox.write_file("solution.py", solution_source(episode.answer))
        await episode.sandbox.write_file("run_hidden.py", RUNNER)
        inputs = json.dumps([x for x, _ in hidden])
        result = await episode.sandbox.run(f"python3 run_hidden.py '{inputs}'")
        lines = result.stdout.strip().splitlines()
        try:
            returned = json.loads(lines[-1]) if result.ok and lines else []
        except json.JSONDecodeError:
            returned = []
        passed = (
            sum(got == repr(want) for got, (_, want) in zip(returned, hidden, strict=False))
            if isinstance(returned, list)
            else 0
        )
        episode.metrics["tests_passed"] = float(passed)
        episode.metrics["tests_total"] = float(len(hidden))
        episode.metrics["timed_out"] = float(result.timed_out)

    def score(self, task: Task, episode: Episode) -> Score:
        return Score.of("tests", episode.metrics["tests_passed"] / episode.metrics["tests_total"])

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]
