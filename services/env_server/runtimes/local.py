"""`local`: sandboxes under bubblewrap (Debian's `bubblewrap`, installed by `make setup`).

A sandbox is a host folder, `<root>/<worker pid>/<random>`, that only it sees: each command is
a fresh `bwrap` whose one writable mount is that folder (at /workspace), over a read-only root
holding just /usr (no /etc, no /home, no project files), a private /tmp, no network (its own
network namespace has only a loopback that is down), and its own pid namespace: when the
command's shell exits, or bwrap is killed, everything it started dies with it, and
`--die-with-parent` does the same when the worker itself dies. Commands run as an unprivileged
user (nobody when the worker is root: a root uid is exempt from the process limit and would own
the files it must not read) under `prlimit` limits on CPU time, address space, processes,
file size and open files.

Files are read and written from the host side, with the path resolved and checked to stay in
the sandbox's folder (a symlink the model made cannot point the worker outside it); no command
runs meanwhile, because a command's processes all end with it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rlrun.common.procfs import alive, descendants
from rlrun.env_server.sdk.sandbox import CommandResult, RetryPolicy, Sandbox, SandboxError, SandboxRuntime

WORKSPACE = "/workspace"
NOBODY = 65534
PATH = "/usr/local/bin:/usr/bin:/bin"
_CHUNK = 65536


def _positive(name: str, value: float) -> None:
    from rlrun.env_server.runtimes.registry import RuntimeOptionError

    if not value > 0:
        raise RuntimeOptionError(name, f"must be > 0, got {value}")


class LocalRuntime(SandboxRuntime):
    def __init__(
        self,
        timeout_s: float = 10.0,
        output_limit: int = 16384,
        cpu_s: int = 10,
        memory_mb: int = 1024,
        max_processes: int = 64,
        file_mb: int = 64,
        tmp_mb: int = 64,
        root: str | None = None,
        retries: int = 2,
        retry_backoff_s: float = 0.05,
        bwrap: str = "bwrap",
    ):
        """`timeout_s`, `output_limit` (bytes of stdout and of stderr): a command's defaults.
        `cpu_s`, `memory_mb` (address space), `max_processes`, `file_mb` (largest file),
        `tmp_mb` (/tmp's size): limits of every command. `root`: the host folder that holds
        the sandboxes (default: the temp dir's `rlrun-sandboxes`). `retries`,
        `retry_backoff_s`: the retry policy of calls bwrap failed to start."""
        from rlrun.env_server.runtimes.registry import RuntimeOptionError

        for name, value in (
            ("timeout_s", timeout_s),
            ("output_limit", output_limit),
            ("cpu_s", cpu_s),
            ("memory_mb", memory_mb),
            ("max_processes", max_processes),
            ("file_mb", file_mb),
            ("tmp_mb", tmp_mb),
        ):
            _positive(name, value)
        try:
            self.retry = RetryPolicy(retries, retry_backoff_s)
        except ValueError as error:
            raise RuntimeOptionError("retries" if retries < 0 else "retry_backoff_s", str(error)) from None
        found = shutil.which(bwrap)
        if found is None:
            raise RuntimeOptionError(
                "bwrap",
                f"{bwrap!r} is not on PATH: the local runtime needs bubblewrap (`make setup` installs "
                "Debian's `bubblewrap`)",
            )
        self.bwrap = found
        self.timeout_s = timeout_s
        self.output_limit = output_limit
        self.limits = [
            f"--cpu={int(cpu_s)}",
            f"--as={int(memory_mb) << 20}",
            f"--nproc={int(max_processes)}",
            f"--fsize={int(file_mb) << 20}",
            "--nofile=256",
            "--core=0",
        ]
        self.tmp_bytes = int(tmp_mb) << 20
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / "rlrun-sandboxes"
        self.uid = NOBODY if os.geteuid() == 0 else os.geteuid()
        self.gid = NOBODY if os.geteuid() == 0 else os.getegid()
        closed = self._closed_ancestor()
        if closed is not None:
            raise RuntimeOptionError(
                "root",
                f"{self.root}: the sandboxes' user (uid {self.uid}) cannot enter {closed} (mode "
                f"{closed.stat().st_mode & 0o777:o}); bwrap, run as that user, could not mount them",
            )
        self._swept = False

    def _closed_ancestor(self) -> Path | None:
        """The first existing folder on the way to `root` that the sandboxes' user cannot enter."""
        for folder in reversed([self.root, *self.root.parents]):
            try:
                info = folder.stat()
            except FileNotFoundError:
                return None
            if not info.st_mode & 0o001 and info.st_uid != self.uid:
                return folder
        return None

    def own_root(self, pid: int | None = None) -> Path:
        """The folder of the sandboxes of process `pid` (default: this one)."""
        return self.root / str(os.getpid() if pid is None else pid)

    def reap(self, pid: int) -> None:
        shutil.rmtree(self.own_root(pid), ignore_errors=True)

    def _sweep(self) -> None:
        """Removes the folders of processes that are gone (a worker killed before its pool
        could reap it, an env-server killed with its pool)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                if entry.name.isdigit() and not alive(int(entry.name)):
                    shutil.rmtree(entry, ignore_errors=True)

    async def create(self, files: Mapping[str, str]) -> Sandbox:
        parent = self.own_root()
        if not self._swept:
            self._sweep()
            self._swept = True
            # This process's folder goes when it exits (its sandboxes went when they closed).
            atexit.register(_remove_empty, parent)
        parent.mkdir(parents=True, exist_ok=True)
        folder = parent / secrets.token_hex(8)
        folder.mkdir(mode=0o700)
        sandbox = LocalSandbox(self, folder)
        try:
            os.chown(folder, self.uid, self.gid)
            for path, text in files.items():
                await sandbox.write_file(path, text)
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def command(self, folder: Path, started_fd: int, command: str) -> list[str]:
        """The bwrap command line that runs `command` in the sandbox at `folder`."""
        return [
            self.bwrap,
            "--unshare-user",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--ro-bind",
            "/usr",
            "/usr",
            *("--symlink", "usr/bin", "/bin"),
            *("--symlink", "usr/sbin", "/sbin"),
            *("--symlink", "usr/lib", "/lib"),
            *("--symlink", "usr/lib64", "/lib64"),
            *("--proc", "/proc", "--dev", "/dev"),
            *("--size", str(self.tmp_bytes), "--tmpfs", "/tmp"),
            *("--bind", str(folder), WORKSPACE, "--chdir", WORKSPACE),
            *("--remount-ro", "/"),
            "--clearenv",
            *("--setenv", "PATH", PATH, "--setenv", "HOME", WORKSPACE, "--setenv", "LANG", "C.UTF-8"),
            "--",
            "prlimit",
            *self.limits,
            "--",
            "bash",  # dash takes no fd numbers above 9
            "-c",
            # Says on `started_fd` that the sandbox and its limits are set up, closes it (the
            # command never sees it), then runs the command: a failure before that is bwrap's.
            f'printf started >&{started_fd} && exec {started_fd}>&- && exec sh -c "$0"',
            command,
        ]


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of `stream`, and whether there was more (read to its end and
    dropped, so that the command never blocks on a full pipe)."""
    kept = bytearray()
    more = False
    while chunk := await stream.read(_CHUNK):
        room = limit - len(kept)
        if len(chunk) > room:
            more = True
        kept += chunk[: max(room, 0)]
    return bytes(kept), more


class LocalSandbox(Sandbox):
    def __init__(self, runtime: LocalRuntime, folder: Path):
        self.runtime = runtime
        self.folder = folder
        self._running: set[asyncio.subprocess.Process] = set()
        self.closed = False

    def _path(self, path: str) -> Path:
        resolved = Path(os.path.realpath(self.folder / path))
        if resolved != self.folder and self.folder not in resolved.parents:
            raise ValueError(f"{path!r} is outside the working directory")
        return resolved

    async def read_file(self, path: str) -> str:
        return self._path(path).read_text(errors="replace")

    async def write_file(self, path: str, text: str) -> None:
        target = self._path(path)
        folder = target.parent
        missing = [p for p in [folder, *folder.parents] if self.folder in p.parents and not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        for made in [*missing, target]:
            os.chown(made, self.runtime.uid, self.runtime.gid)

    async def run(
        self, command: str, timeout_s: float | None = None, output_limit: int | None = None
    ) -> CommandResult:
        if self.closed:
            raise SandboxError("the sandbox is closed")
        timeout = self.runtime.timeout_s if timeout_s is None else timeout_s
        limit = self.runtime.output_limit if output_limit is None else output_limit
        return await self.runtime.retry.call(lambda: self._run_once(command, timeout, limit))

    async def _run_once(self, command: str, timeout_s: float, limit: int) -> CommandResult:
        started_read, started_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.runtime.command(self.folder, started_write, command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(started_write,),
                start_new_session=True,
                user=self.runtime.uid if os.geteuid() == 0 else None,
                group=self.runtime.gid if os.geteuid() == 0 else None,
                extra_groups=[] if os.geteuid() == 0 else None,
            )
        except OSError as error:
            os.close(started_read)
            raise SandboxError(f"cannot start bwrap: {error}") from None
        finally:
            os.close(started_write)
        self._running.add(process)
        if self.closed:
            # close() ran while bwrap was being started, before it could be seen here: it is
            # killed now, as close() would have, rather than left to run in a removed folder.
            _kill(process)
        timed_out = False
        try:
            assert process.stdout is not None and process.stderr is not None
            reads = asyncio.gather(_read_capped(process.stdout, limit), _read_capped(process.stderr, limit))
            try:
                (stdout, more_out), (stderr, more_err) = await asyncio.wait_for(
                    asyncio.shield(reads), timeout_s
                )
            except TimeoutError:
                timed_out = True
                _kill(process)
                (stdout, more_out), (stderr, more_err) = await reads
            code = await process.wait()
        except BaseException:
            _kill(process)
            raise
        finally:
            self._running.discard(process)
            started = _drain(started_read)
        if not started and not self.closed and not timed_out:
            raise SandboxError(
                f"bwrap could not set up the sandbox: {stderr.decode(errors='replace')[-500:]}"
            )
        return CommandResult(
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace"),
            128 - code if code < 0 else code,
            timed_out=timed_out,
            truncated=more_out or more_err,
        )

    def close(self) -> None:
        for process in list(self._running):
            _kill(process)
        self._running.clear()
        self.closed = True
        shutil.rmtree(self.folder, ignore_errors=True)


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def _kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL to bwrap and the processes below it, innermost first: the sandbox's pid
    namespace dies with its first process, and bwrap's `--die-with-parent` alone would miss a
    child that bwrap had started but not yet told to die with it."""
    for pid in reversed(descendants(process.pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _drain(fd: int) -> bytes:
    """What is in the pipe `fd` (its writers are gone), and closes it."""
    os.set_blocking(fd, False)
    with os.fdopen(fd, "rb", closefd=True) as pipe:
        try:
            return pipe.read() or b""
        except BlockingIOError:
            return b""
