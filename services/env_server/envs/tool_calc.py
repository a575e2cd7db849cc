"""tool-calc: arithmetic too big to do in one's head, with a calculator tool.

The model may answer `calc(<expression>)`; the result comes back as a tool message, and the
next assistant message that is not a call is the answer (exact match). The prompt is just the
problem, e.g. `417*38`.
"""

from __future__ import annotations

import ast
import operator
import random

from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.errors import ToolError
from rlrun.env_server.sdk.harnesses import ToolCallingHarness
from rlrun.env_server.sdk.scoring import exact_match
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_EXPRESSION_CHARS = 64
MAX_MAGNITUDE = 10**18


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise ToolError("division by zero")
        value = _BINARY[type(node.op)](left, right)
        if abs(value) > MAX_MAGNITUDE:
            raise ToolError("result too large")
        return value
    raise ToolError("only integers, + - * // % and parentheses are allowed")


def calculate(expression: str) -> str:
    """The calculator tool: evaluates integer arithmetic safely (no names, no calls, no powers)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError("not an expression") from None
    return str(_evaluate(tree.body))


class ToolCalc(Environment):
    def __init__(
        self,
        min_operand: int = 10,
        max_operand: int = 999,
        ops: str = "*",
        max_tool_calls: int = 2,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 256,
    ):
        if not 0 <= min_operand <= max_operand:
            raise ValueError(f"need 0 <= min_operand <= max_operand, got {min_operand}, {max_operand}")
        if not ops or any(op not in "+-*" for op in ops):
            raise ValueError(f"ops must be a non-empty string of +-*, got {ops!r}")

        def draw(rng: random.Random) -> Example:
            a, b = rng.randint(min_operand, max_operand), rng.randint(min_operand, max_operand)
            problem = f"{a}{rng.choice(ops)}{b}"
            return Example(
                key=problem, prompt=problem, data={"problem": problem, "answer": calculate(problem)}
            )

        self.taskset = GeneratedTaskset(draw, seed, train_size, eval_size)
        self.tools = {"calc": calculate}
        self.harness = ToolCallingHarness(self.tools, max_tool_calls=max_tool_calls)

    def score(self, task: Task, episode: Episode) -> Score:
        return Score.of("correct", exact_match(episode.answer, task.data["answer"]))

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]
