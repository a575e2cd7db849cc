"""Tool calls that run in the episode's sandbox: `bash`, `read_file`, `write_file`, `run_tests`.

The calls are written as the calculator's are (tool_calling.py): an assistant message that is
exactly `name(args)`:
  bash(<command>)             runs the command in the working directory
  read_file(<path>)           the file's text
  write_file(<path>\\n<text>)  the first line is the path, the rest the file's text
  run_tests()                 runs the task's `run_tests` command (`task.data["run_tests"]`)
Each result is a tool message (an observation node). When the model answers without a call, or
has used up `max_tool_calls`, the env's `grade(task, episode)` runs (still in the sandbox, e.g.
the hidden tests) and records what the scorer reads in the episode's metrics.

`setup` creates each episode's sandbox with the task's files (`task.data["files"]`, path ->
text), so its time is the trace's `setup_s`; the rollout runner destroys them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rlrun.common.wire.trace import StopCondition
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harness import Harness
from rlrun.env_server.sdk.harnesses.tool_calling import parse_tool_call
from rlrun.env_server.sdk.sandbox import Sandbox, SandboxRuntime
from rlrun.env_server.sdk.task import Task

Grade = Callable[[Task, Episode], Awaitable[None]]
"""Runs after the episode's last turn, with `episode.sandbox` still there."""

TOOLS = ("bash", "read_file", "write_file", "run_tests")


class SandboxToolHarness(Harness):
    def __init__(
        self,
        runtime: SandboxRuntime,
        grade: Grade | None = None,
        max_tool_calls: int = 4,
        timeout_s: float | None = None,
    ):
        """`timeout_s`: of each command the model runs (default: the runtime's)."""
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.runtime = runtime
        self.grade = grade
        self.max_tool_calls = max_tool_calls
        self.timeout_s = timeout_s

    async def setup(self, episodes: list[Episode]) -> None:
        async def create(episode: Episode) -> None:
            files = episode.task.data.get("files", {})
            episode.sandbox = await self.runtime.retry.call(lambda: self.runtime.create(files))

        await asyncio.gather(*(create(episode) for episode in episodes))

    async def call(self, sandbox: Sandbox, task: Task, name: str, args: str) -> str:
        """The tool's result as the model sees it; a tool's own failure is an `error: ...`
        result (a SandboxError, the backend failing, is not: it fails the rollout)."""
        if name == "bash":
            return (await sandbox.run(args, self.timeout_s)).render()
        if name == "run_tests":
            command = task.data.get("run_tests")
            if not command:
                return "error: this task has no tests to run"
            return (await sandbox.run(command, self.timeout_s)).render()
        if name == "read_file":
            try:
                return await sandbox.read_file(args.strip())
            except (OSError, ValueError) as error:
                return f"error: {error}"
        if name == "write_file":
            path, _, text = args.partition("\n")
            try:
                await sandbox.write_file(path.strip(), text)
            except (OSError, ValueError) as error:
                return f"error: {error}"
            return f"wrote {len(text)} characters to {path.strip()}"
        return f"error: unknown tool {name} (the tools: {', '.join(TOOLS)})"

    async def run(self, episode: Episode) -> None:
        if episode.sandbox is None:
            raise RuntimeError("the episode has no sandbox: SandboxToolHarness.setup did not run")
        episode.metrics["tool_calls"] = 0
        stop: StopCondition = "completed"
        while True:
            completion = await episode.generate()
            if completion.finish_reason == "length":
                stop = "length"
                break
            call = parse_tool_call(episode.answer)
            if call is None:
                break
            if episode.metrics["tool_calls"] == self.max_tool_calls:
                stop = "max_turns"
                break
            episode.metrics["tool_calls"] += 1
            result = await self.call(episode.sandbox, episode.task, *call)
            episode.conversation.add_observation("tool", result)
        if self.grade is not None:
            await self.grade(episode.task, episode)
        episode.finish(stop)
