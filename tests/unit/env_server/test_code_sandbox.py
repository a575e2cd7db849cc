"""The sandbox tool harness and the code-sandbox env, through the rollout runner and the real
bubblewrap: rewards from hidden tests, tool results as observation nodes, setup timing, and no
sandbox left after a rollout ends, is cancelled or abandoned."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlrun.common.wire.inference import Completion
from rlrun.env_server.envs.code_sandbox import CodeSandbox
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.runtimes.local import LocalRuntime
from rlrun.env_server.runtimes.registry import RuntimeOptionError
from rlrun.env_server.server.rollout import CANCELLED, RolloutJob, Runtime, run_rollouts

from ...support.sandbox_procs import gone, sandbox_base, started
from .test_rollout import plan


class ScriptedClient:
    """Duck-types InferenceClient.generate: the k-th call of the job answers `answers[k]` (the
    last one again after the end)."""

    def __init__(self, tokenizer, answers: list[str]):
        self.tokenizer = tokenizer
        self.answers = answers
        self.calls = 0

    async def generate(self, addresses, prompt_ids, sampling, request_id=""):
        text = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        tokens = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        return [Completion(tokens, [-0.5] * len(tokens), "stop", 1, 1) for _ in range(sampling.n)]


@pytest.fixture
def base() -> Iterator[Path]:
    with sandbox_base() as folder:
        yield folder


def env_in(base: Path, **args) -> CodeSandbox:
    env = make_env("code-sandbox", args, runtime={"type": "local", "root": str(base), "timeout_s": 10})
    assert isinstance(env, CodeSandbox)
    return env


def leftovers(base: Path) -> list[str]:
    return [str(p) for p in base.rglob("*")]


async def rollouts(env, tokenizer, client, n=2, idx=5, timeout_s=60.0, cancelled=None):
    job = RolloutJob(
        "cs", env.taskset.get("train", idx), plan(max_tokens=200), "grp", [f"grp/{i}" for i in range(n)]
    )
    return await run_rollouts(
        env, job, Runtime(tokenizer, client, 4096), timeout_s, cancelled or asyncio.Event()
    )


async def test_the_reference_passes_every_hidden_test_and_the_sandboxes_are_gone(tokenizer, base):
    env = env_in(base)
    task = env.taskset.get("train", 5)
    traces = await rollouts(env, tokenizer, ScriptedClient(tokenizer, [env.reference_answer(task)]))
    for trace in traces:
        assert trace.errors == [] and trace.reward == 1.0
        assert trace.metrics["tests_passed"] == trace.metrics["tests_total"] == 6
        assert trace.timing["setup_s"] > 0
    assert leftovers(base) == [str(base / str(os.getpid()))]


@pytest.mark.parametrize(
    ("answer", "best"),
    [
        ("x", 0.5),  # right only by chance, if at all
        ("open('/etc/shadow').read()", 0.0),
        ("__import__('os').system('cat /etc/shadow')", 0.0),
        ('print(\'["1", "2", "3", "4", "5", "6"]\') or x', 0.5),  # printing claims nothing
        ("__import__('time').sleep(60)", 0.0),
        ("(", 0.0),
    ],
)
async def test_wrong_and_hostile_answers_score_low_and_the_run_goes_on(tokenizer, base, answer, best):
    env = env_in(base)
    env.runtime.timeout_s = 1.0  # type: ignore[attr-defined]
    traces = await rollouts(env, tokenizer, ScriptedClient(tokenizer, [answer]), n=1)
    [trace] = traces
    assert trace.errors == [] and trace.reward <= best
    assert leftovers(base) == [str(base / str(os.getpid()))]


async def test_tool_calls_run_in_the_sandbox_and_come_back_as_observation_nodes(tokenizer, base):
    env = env_in(base, max_tool_calls=5)
    task = env.taskset.get("train", 5)
    answers = [
        "bash(echo hi; ls)",
        f"write_file(solution.py\ndef f(x):\n    return {task.data['answer']}\n)",
        "run_tests()",
        "read_file(solution.py)",
        "read_file(/etc/shadow)",
        task.data["answer"],
    ]
    [trace] = await rollouts(env, tokenizer, ScriptedClient(tokenizer, answers), n=1)
    assert trace.errors == [] and trace.reward == 1.0 and trace.stop_condition == "completed"
    tools = [node for node in trace.nodes if node.role == "tool"]
    assert all(node.is_observation and node.num_sampled == 0 for node in tools)
    results = [node.content for node in tools]
    assert results[0].startswith("exit code 0\nstdout:\nhi\ntests.py")
    assert results[1] == f"wrote {len(answers[1].split(chr(10), 1)[1]) - 1} characters to solution.py"
    assert results[2].count(": ok") == 2 and "FAIL" not in results[2]
    assert results[3].startswith("def f(x):")
    assert results[4].startswith("error: ") and "outside the working directory" in results[4]
    roles = [node.role for node in trace.nodes]
    assert roles == ["user"] + ["assistant", "tool"] * 5 + ["assistant"]
    assert trace.metrics["tool_calls"] == 5


async def test_cancelling_or_abandoning_mid_command_leaves_no_sandbox(tokenizer, base):
    env = env_in(base, max_tool_calls=3)
    cancelled = asyncio.Event()
    client = ScriptedClient(tokenizer, ["bash(sleep 35.2468)"])
    running = asyncio.ensure_future(rollouts(env, tokenizer, client, cancelled=cancelled))
    assert await started("35.2468", count=2)
    cancelled.set()
    for trace in await running:
        assert trace.stop_condition == "cancelled" and trace.errors == [CANCELLED]
    assert await gone("35.2468")
    assert leftovers(base) == [str(base / str(os.getpid()))]

    abandoned = asyncio.ensure_future(
        rollouts(env, tokenizer, ScriptedClient(tokenizer, ["bash(sleep 36.1357)"]))
    )
    assert await started("36.1357")
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    assert await gone("36.1357")
    assert leftovers(base) == [str(base / str(os.getpid()))]


async def test_a_backend_that_cannot_start_fails_the_rollout_retryably(tokenizer, base):
    env = env_in(base)
    env.runtime.bwrap = "/bin/false"  # type: ignore[attr-defined]
    env.runtime.retry = type(env.runtime.retry)(retries=1, backoff_s=0)
    [trace] = await rollouts(env, tokenizer, ScriptedClient(tokenizer, ["x"]), n=1)
    [error] = trace.errors
    assert (error.type, error.retryable) == ("SandboxError", True)


def test_the_runtime_is_chosen_per_env_entry(base):
    env = make_env("code-sandbox", {}, runtime={"type": "local", "root": str(base), "memory_mb": 128})
    assert isinstance(env.runtime, LocalRuntime) and "--as=134217728" in env.runtime.limits
    assert env.harness.runtime is env.runtime  # type: ignore[attr-defined]
    with pytest.raises(RuntimeOptionError, match="runs no commands") as caught:
        make_env("reverse-text", {}, runtime={"type": "local"})
    assert caught.value.field == "type"
    tool_env = make_env("code-sandbox", {}, harness={"id": "sandbox-tools", "args": {"max_tool_calls": 7}})
    assert tool_env.harness.max_tool_calls == 7  # type: ignore[attr-defined]
