"""How one container of a pod starts and stops as local processes (what a container runtime does
for kubelet), and the pod's sandbox: a `sleep` holding the pod's network, UTS and IPC
namespaces, as the pause container does.

A container is `nsenter` into the sandbox's namespaces, then rootfs.py, which unshares a mount and
a PID namespace, builds the container's root and execs the command as PID 1 of the container's
PID namespace. Every process of the container dies with its PID 1. The agent itself runs as a child of PID 1 of a
PID namespace of its own, so that whatever happens to it, nothing it started outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOTFS = Path(__file__).with_name("rootfs.py")
TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Sandbox:
    """The pod's namespaces. `pid` is what containers and probes enter (None: the host's, for a
    hostNetwork pod)."""

    def __init__(self, hostname: str, host_network: bool):
        self.process: subprocess.Popen[bytes] | None = None
        if host_network:
            return
        self.process = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--uts",
                "--ipc",
                "--",
                "/bin/sh",
                "-c",
                'hostname "$0" && exec sleep infinity',
                hostname,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={"PATH": TOOLS_PATH},
        )
        # Until the exec of sleep, the process may still be in the host's namespaces.
        deadline = time.monotonic() + 10
        while _comm(self.process.pid) != "sleep":
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()  # first: the pipe below reaches its end only once the process is gone
                assert self.process.stderr is not None
                error = (
                    self.process.stderr.read().decode(errors="replace").strip() or "no exec of sleep in 10s"
                )
                self.process.stderr.close()
                raise RuntimeError(f"the pod sandbox did not start: {error}")
            time.sleep(0.01)
        assert self.process.stderr is not None
        self.process.stderr.close()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def enter(self) -> list[str]:
        """The nsenter arguments that join a process to the pod's namespaces."""
        if self.pid is None:
            return []
        return ["nsenter", *(f"--{ns}=/proc/{self.pid}/ns/{ns}" for ns in ("net", "uts", "ipc")), "--"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass
class Launch:
    """Everything a container start needs, resolved by the agent (rootfs.py reads it as JSON)."""

    argv: list[str]
    env: dict[str, str]
    workdir: str
    mounts: list[dict[str, Any]]
    uid: int
    gid: int
    groups: list[int]
    read_only_root: bool
    no_new_privileges: bool
    traverse: list[str] = field(default_factory=list)
    users: list[dict[str, Any]] = field(default_factory=list)
    """The image's accounts (images.User): passwd and group lines, home folders."""


class Run:
    """One start of a container: its processes until they exit."""

    def __init__(self, sandbox: Sandbox, launch: Launch, folder: Path, log: Path, python: str):
        folder.mkdir(parents=True)
        (folder / "rootfs").mkdir()
        (folder / "scratch").mkdir()
        spec = {
            "rootfs": str(folder / "rootfs"),
            "scratch": str(folder / "scratch"),
            "argv": launch.argv,
            "env": launch.env,
            "workdir": launch.workdir,
            "mounts": launch.mounts,
            "uid": launch.uid,
            "gid": launch.gid,
            "groups": launch.groups,
            "readOnlyRoot": launch.read_only_root,
            "noNewPrivileges": launch.no_new_privileges,
            "traverse": launch.traverse,
            "users": launch.users,
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        self.folder = folder
        self.launch = launch
        self.sandbox = sandbox
        self.started_at = now_iso()
        self.finished_at: str | None = None
        self.start_error: str | None = None
        log.parent.mkdir(parents=True, exist_ok=True)
        read, write = os.pipe()
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [*sandbox.enter(), python, "-I", "-S", str(ROOTFS), str(folder / "spec.json"), str(write)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(write,),
                start_new_session=True,
                env={"PATH": TOOLS_PATH},
            )
        os.close(write)
        try:
            # EOF: the exec happened (the pipe is close-on-exec); a message: it did not.
            ready, _, _ = select.select([read], [], [], 60)
            message = os.read(read, 65536).decode(errors="replace") if ready else "no exec after 60s"
        finally:
            os.close(read)
        if message:
            self.start_error = message  # rootfs.py exits 128 after writing it
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        """None while running; a signal's death is 128 + the signal, as runtimes report it."""
        code = self.process.poll()
        if code is None:
            return None
        if self.finished_at is None:
            self.finished_at = now_iso()
        return 128 - code if code < 0 else code

    def kill(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the container's PID 1, SIGKILL to all of it after `grace_s`, as a runtime
        stops a container (`runc kill` signals the init process; its children are the program's
        to stop, and the kernel kills whatever is left when PID 1 exits). A PID 1 without a
        SIGTERM handler ignores the signal, as in a container, and is killed after the grace."""
        if self.exit_code() is not None:
            return
        init = self.init_pid()
        if init is None:
            self.kill(signal.SIGTERM)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGTERM)
        try:
            self.process.wait(max(grace_s, 0))
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.process.wait()
        self.exit_code()

    def init_pid(self) -> int | None:
        """The container's PID 1 (the child rootfs.py forked), in the agent's PID namespace."""
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def exec(self, command: list[str], timeout_s: float) -> int:
        """Runs `command` in the container (its namespaces, root, working directory, user and
        environment): an exec probe. A timeout kills it and counts as a failure."""
        pid = self.init_pid()
        if pid is None:
            return -1
        launch = self.launch
        # nsenter by its path: `env` is the container's, whose PATH need not lead to it.
        argv = [
            shutil.which("nsenter", path=TOOLS_PATH) or "nsenter",
            f"--target={pid}",
            "--mount",
            "--pid",
            "--uts",
            "--ipc",
            "--net",
            "--root",
            "--wd",
        ]
        argv += [f"--setuid={launch.uid}", f"--setgid={launch.gid}", "--", *command]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=launch.env,
        )
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -1
