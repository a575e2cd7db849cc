"""Sandboxes: where an episode runs commands, away from the host.

An env that runs code has a `SandboxRuntime` (its `runtime`, chosen per env entry with
`runtime = {type = "local", ...}`; backends in rlrun.env_server.runtimes). A harness creates
one `Sandbox` per episode in its `setup` (so the time counts as the trace's `setup_s`) with the
task's files in the working directory; the model's tools run commands and read and write files
there; the rollout runner destroys every sandbox when the rollout ends, fails or is cancelled
(`close_sandboxes`). What a worker that dies leaves behind, its pool removes (`reap`).

A command that fails, runs past its timeout or prints too much is a result the model sees, not
an error. A `SandboxError` is the backend itself failing (it could not start the command): such
calls are retried per the runtime's `RetryPolicy`, apart from the model calls' own retries,
and once those are spent the rollout fails with a retryable trace error.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class SandboxError(Exception):
    """The sandbox backend failed (not the command run in it)."""


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int
    """The command's exit status; 128 + n when signal n killed it (as a shell reports it)."""
    timed_out: bool = False
    """It ran past its timeout and was killed with everything it started."""
    truncated: bool = False
    """stdout or stderr was longer than the output limit and was cut there."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def render(self) -> str:
        """The result as a tool message shows it to the model."""
        parts = [f"exit code {self.exit_code}" + (" (timed out)" if self.timed_out else "")]
        if self.stdout:
            parts.append(f"stdout:\n{self.stdout}")
        if self.stderr:
            parts.append(f"stderr:\n{self.stderr}")
        if self.truncated:
            parts.append("(output truncated)")
        return "\n".join(parts)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a sandbox call that raised SandboxError is tried again, and the wait before
    the first retry (it doubles with each further one)."""

    retries: int = 2
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {self.backoff_s}")

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = self.backoff_s
        for remaining in range(self.retries, -1, -1):
            try:
                return await attempt()
            except SandboxError:
                if remaining == 0:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


class Sandbox(ABC):
    """One episode's sandbox: a working directory and the commands run in it."""

    @abstractmethod
    async def run(
        self, command: str, timeout_s: float | None = None, output_limit: int | None = None
    ) -> CommandResult:
        """Runs `command` with `sh -c` in the working directory. Defaults: the runtime's."""

    @abstractmethod
    async def read_file(self, path: str) -> str:
        """A file of the working directory (`path` relative to it); FileNotFoundError when
        there is none, ValueError for a path that leaves the working directory."""

    @abstractmethod
    async def write_file(self, path: str, text: str) -> None:
        """Writes a file of the working directory, creating its folders."""

    @abstractmethod
    def close(self) -> None:
        """Kills whatever still runs in the sandbox and removes it. Synchronous, so that it
        also runs in a task being cancelled; closing twice is harmless."""


class SandboxRuntime(ABC):
    """A sandbox backend as an env entry configures it."""

    retry: RetryPolicy = RetryPolicy()

    @abstractmethod
    async def create(self, files: Mapping[str, str]) -> Sandbox:
        """A fresh sandbox whose working directory holds `files` (relative path -> text)."""

    def reap(self, pid: int) -> None:
        """Removes what sandboxes made by process `pid` (a worker that died) left behind.
        Default: nothing (a backend whose sandboxes die with their owner)."""
        return None


def close_sandboxes(sandboxes: list[Sandbox | None]) -> None:
    """Closes every sandbox, each even when closing another failed (the first error is raised
    after all were tried)."""
    failure: Exception | None = None
    for sandbox in sandboxes:
        if sandbox is None:
            continue
        try:
            sandbox.close()
        except Exception as error:
            failure = failure or error
    if failure is not None:
        raise failure
