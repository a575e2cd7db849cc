"""The cluster's processes: each started in a session of its own, its output in a log file, and
killed with its parent (`setpriv --pdeathsig`), so that a crashed or interrupted test run leaves
no etcd or API server behind; `stop()` ends the whole process group and waits for it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TOOLS = Path(os.environ.get("RLRUN_K8S_TOOLS", REPO / ".k8s"))
"""Where `make k8s-tools` (tools/k8s/build.sh) puts the binaries, Kueue's manifests and kwok's
stages."""


class ClusterError(RuntimeError):
    pass


def tool(name: str) -> str:
    """The path of a built tool; fails (never skips) when it is missing."""
    path = TOOLS / "bin" / name
    if not os.access(path, os.X_OK):
        raise ClusterError(f"{path} is missing: run `make k8s-tools` (tools/k8s/build.sh) to build it")
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for(
    check: Callable[[], object], timeout: float, what: str, process: Process | None = None
) -> object:
    """Polls `check()` until it returns a truthy value; a process that exits meanwhile fails
    at once with its log's tail."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.exited():
            raise ClusterError(
                f"{process.name} exited ({process.returncode()}) before {what}:\n{process.tail()}"
            )
        try:
            value = check()
            if value:
                return value
        except Exception as error:  # noqa: BLE001 - not up yet, whatever the reason
            last = error
        time.sleep(0.2)
    detail = f"\n{process.tail()}" if process is not None else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){detail}")


class Process:
    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.argv = argv
        self.log = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        setpriv = shutil.which("setpriv")
        prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
        with self.log.open("ab") as out:
            self._popen = subprocess.Popen(
                [*prefix, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env if env is not None else dict(os.environ),
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def exited(self) -> bool:
        return self._popen.poll() is not None

    def returncode(self) -> int | None:
        return self._popen.poll()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`; waits for the exit."""
        if self.exited():
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self._popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self._popen.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
        raise ClusterError(f"{self.name} (pid {self.pid}) did not exit after SIGKILL")
