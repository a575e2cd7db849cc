"""Child service processes: start with port 0, read the address from the ready line, restart
one that dies on the port it had (as Kubernetes restarts a container: with backoff, up to a
limit), and shut everything down so that no process is ever left behind."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlrun.common.service import LAUNCHER_PID_ENV

READY = re.compile(r"^rlrun (?P<service>[\w-]+) listening on (?P<host>[^\s:]+|\[[^\]]+\]):(?P<port>\d+)$")


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the child's process group (it leads one), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class ChildFailed(RuntimeError):
    """A service process died or never became ready; the message names it and its log."""


def raise_autogroup_priority(pid: int, nice: int) -> bool:
    """Sets the nice value of the scheduling group (autogroup) of `pid`'s session; True when
    the kernel took it. A negative value needs CAP_SYS_NICE, and kernels without autogroups
    have no such file: either way the run goes on at equal priority."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def describe_exit(returncode: int) -> str:
    """`was killed by SIGKILL` or `exited with code 1`."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def with_port(argv: list[str], port: str) -> list[str]:
    """`argv` with the value after `--port` replaced (a restart binds the port it had)."""
    out = list(argv)
    out[out.index("--port") + 1] = port
    return out


@dataclass
class Child:
    name: str
    argv: list[str]
    log_file: Path
    """The service's own log (it writes it); its stderr, tracebacks included, goes to `.stderr`."""
    own_session: bool = False
    process: subprocess.Popen | None = None
    address: str = ""
    extra_output: list[str] = field(default_factory=list)
    restarts: int = 0

    @property
    def stderr_file(self) -> Path:
        return self.log_file.with_suffix(".stderr")

    def failure(self, what: str) -> ChildFailed:
        """Names the child, how it ended and its logs; the reason a service gives for not
        starting (its last stderr line, `rlrun serve <service>: ...`) stands alone, anything
        else comes with the last lines of its stderr."""
        last = tail(self.stderr_file)
        said = last.splitlines()[-1] if last else ""
        if said.startswith("rlrun serve "):
            return ChildFailed(f"{self.name} {what}: {said.split(': ', 1)[1]} (its log: {self.log_file})")
        return ChildFailed(
            f"{self.name} {what}; its log is {self.log_file} (stderr: {self.stderr_file}). Last lines:\n{last}"
        )


class ProcessGroup:
    """Every child the launcher started, stopped together in reverse start order."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        argv: list[str],
        log_file: Path,
        ready_timeout_s: float = 180.0,
        own_session: bool = False,
    ) -> Child:
        """`own_session`: the child runs in a session (and so a CPU scheduling group) of its own
        instead of the launcher's."""
        child = Child(name=name, argv=argv, log_file=log_file, own_session=own_session)
        self.children.append(child)
        self._launch(child, ready_timeout_s)
        return child

    def _launch(self, child: Child, ready_timeout_s: float) -> None:
        child.log_file.parent.mkdir(parents=True, exist_ok=True)
        with child.stderr_file.open("ab") as stderr:
            child.process = subprocess.Popen(
                child.argv,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                # If the launcher is killed outright (SIGKILL), the kernel still stops the child:
                # it asks for that itself (stop_with_launcher), since a preexec_fn would make
                # Python fork instead of vfork, and gRPC's fork handlers abort a child forked
                # while the launcher's channels are open (a restart mid-run died with SIGABRT).
                env={**self.env, LAUNCHER_PID_ENV: str(os.getpid())},
                # Either way the child leads its own process group, so a stop can kill the
                # whole group. A new session also puts it in its own scheduling group where
                # the kernel's autogroup scheduling is on (Linux' default): the CPU is then
                # shared fairly between sessions first, and between the threads of one
                # session only within that session's share.
                start_new_session=child.own_session,
                process_group=None if child.own_session else 0,
                text=True,
                bufsize=1,
            )
        child.address = self._await_ready(child, ready_timeout_s)

    def exited(self) -> list[Child]:
        """The children that have exited, in start order."""
        return [c for c in self.children if c.process is not None and c.process.poll() is not None]

    def restart(self, child: Child, argv: list[str], ready_timeout_s: float = 180.0) -> None:
        """Starts `child` again with `argv` (its port pinned to the old one by the caller);
        raises ChildFailed when it does not come back ready."""
        assert child.process is not None
        if child.process.stdout is not None:
            child.process.stdout.close()
        child.argv, child.restarts = argv, child.restarts + 1
        self._launch(child, ready_timeout_s)

    def _await_ready(self, child: Child, timeout_s: float) -> str:
        assert child.process is not None and child.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        selector = selectors.DefaultSelector()
        selector.register(child.process.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not selector.select(timeout=0.2):
                    if child.process.poll() is not None:
                        raise child.failure(f"{describe_exit(child.process.returncode)} before it was ready")
                    continue
                line = child.process.stdout.readline()
                if not line:
                    raise child.failure(self._ended_before_ready(child))
                match = READY.match(line.strip())
                if match:
                    return f"{match['host']}:{match['port']}"
                child.extra_output.append(line.rstrip())
            raise child.failure(f"printed no ready line within {timeout_s:.0f} s")
        finally:
            selector.close()

    @staticmethod
    def _ended_before_ready(child: Child, grace_s: float = 5.0) -> str:
        """The child closed its stdout without a ready line: how it ended. One that does not
        exit within `grace_s` after that is killed (its process group), never waited on forever."""
        assert child.process is not None
        try:
            child.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _kill_group(child.process)
            return f"closed its output before it was ready and did not exit within {grace_s:.0f} s; killed it"
        return f"{describe_exit(child.process.returncode)} before it was ready"

    def stop(self, grace_s: float = 10.0) -> None:
        running = [c for c in reversed(self.children) if c.process is not None and c.process.poll() is None]
        for child in running:
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in running:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"rlrun: {child.name} did not stop within {grace_s:.0f} s; killing it", file=sys.stderr)
                _kill_group(child.process)
        for child in self.children:
            if child.process is not None and child.process.stdout is not None:
                child.process.stdout.close()
