"""The local sandbox runtime against the real bubblewrap: commands, files, limits, escapes, and
nothing left behind. Without `bwrap` (make setup installs it) these fail: LocalRuntime refuses
to be built."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlrun.env_server.runtimes.local import LocalRuntime
from rlrun.env_server.runtimes.registry import RuntimeOptionError, make_runtime
from rlrun.env_server.sdk.sandbox import SandboxError

from ...support.sandbox_procs import gone, sandbox_base, started

REPO = Path(__file__).resolve().parents[3]


def exists(path: str | Path) -> bool:
    return os.path.exists(path)


@pytest.fixture
def base() -> Iterator[Path]:
    with sandbox_base() as folder:
        yield folder


@pytest.fixture
def runtime(base) -> LocalRuntime:
    return LocalRuntime(root=str(base / "sandboxes"), timeout_s=20.0, max_processes=32)


async def test_a_command_sees_the_tasks_files_and_reports_its_output_and_exit_code(runtime):
    sandbox = await runtime.create({"a.txt": "hello", "pkg/b.py": "print(6 * 7)"})
    try:
        result = await sandbox.run("cat a.txt; python3 pkg/b.py; echo oops >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == ("hello42\n", "oops\n", 3)
        assert not result.timed_out and not result.truncated
        assert (await sandbox.run("echo made > new.txt")).ok
        assert await sandbox.read_file("new.txt") == "made\n"
        await sandbox.write_file("deep/er/c.txt", "from the host")
        assert (await sandbox.run("cat deep/er/c.txt && echo more >> deep/er/c.txt")).ok
        assert await sandbox.read_file("deep/er/c.txt") == "from the hostmore\n"
    finally:
        sandbox.close()
    assert list((Path(runtime.root) / str(os.getpid())).iterdir()) == []


async def test_output_past_the_limit_is_cut_and_said_so(runtime):
    sandbox = await runtime.create({})
    try:
        result = await sandbox.run("yes | head -c 100000", output_limit=1000)
        assert result.ok and result.truncated and len(result.stdout) == 1000
    finally:
        sandbox.close()


async def test_the_sandbox_cannot_read_host_files_or_write_outside_its_folder(runtime):
    sandbox = await runtime.create({})
    try:
        for path in ("/etc/shadow", "/etc/passwd", str(REPO / "README.md"), str(Path.home() / ".bashrc")):
            result = await sandbox.run(f"cat {path}")
            assert result.exit_code != 0 and result.stdout == "", path
        assert not (await sandbox.run("touch /usr/escaped || touch /escaped")).ok
        assert not exists("/usr/escaped")
        # A symlink made inside must not lead the worker's own file access out of the folder.
        assert (await sandbox.run("ln -s /etc/shadow shadow && ln -s ../../.. up")).ok
        for link in ("shadow", "up/README.md", "../../x"):
            with pytest.raises(ValueError, match="outside the working directory"):
                await sandbox.read_file(link)
        with pytest.raises(ValueError, match="outside the working directory"):
            await sandbox.write_file("up/planted", "x")
        # /tmp is the sandbox's own.
        assert (await sandbox.run("echo mine > /tmp/rlrun-sandbox-test")).ok
        assert not exists("/tmp/rlrun-sandbox-test")
    finally:
        sandbox.close()


async def test_the_sandbox_cannot_reach_a_server_on_the_hosts_loopback(runtime):
    connections = []

    async def accept(reader, writer):
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    )
    sandbox = await runtime.create({"probe.py": probe})
    try:
        # The same probe run on the host connects: the server is there.
        direct = await asyncio.create_subprocess_exec(sys.executable, "-c", probe)
        assert await direct.wait() == 0 and connections == [1]
        result = await sandbox.run("python3 probe.py")
        assert result.exit_code != 0 and "connected" not in result.stdout
        assert "Error" in result.stderr
        assert connections == [1]
    finally:
        sandbox.close()
        server.close()


async def test_a_fork_bomb_is_stopped_by_the_process_limit_and_the_run_goes_on(runtime):
    counter = textwrap.dedent(
        """
        import os, time
        forked = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                forked += 1
        except OSError as error:
            print(forked, type(error).__name__)
        """
    )
    sandbox = await runtime.create({"bomb.py": counter})
    try:
        result = await sandbox.run("python3 bomb.py", timeout_s=15)
        forked, error = result.stdout.split()
        assert error == "BlockingIOError" and 0 < int(forked) < 32
        assert not result.timed_out  # the limit stopped it, not the timeout
        bomb = await sandbox.run("bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", timeout_s=10)
        assert bomb.exit_code is not None
        assert (await sandbox.run("echo still here")).stdout == "still here\n"
    finally:
        sandbox.close()


async def test_a_command_past_its_timeout_is_killed_with_everything_it_started(runtime):
    sandbox = await runtime.create({})
    try:
        result = await sandbox.run("(sleep 31.1234 &); sleep 31.1234", timeout_s=0.5)
        assert result.timed_out and result.exit_code == 137 and not result.ok
        assert await gone("31.1234")
        assert (await sandbox.run("echo next")).stdout == "next\n"
    finally:
        sandbox.close()


async def test_cpu_time_is_limited(base):
    runtime = LocalRuntime(root=str(base), cpu_s=1, timeout_s=30)
    sandbox = await runtime.create({})
    try:
        result = await sandbox.run("python3 -c 'while True: pass'")
        assert result.exit_code == 128 + signal.SIGKILL and not result.timed_out
    finally:
        sandbox.close()


async def test_closing_during_a_command_kills_it_and_removes_the_folder(runtime):
    sandbox = await runtime.create({})
    running = asyncio.ensure_future(sandbox.run("sleep 32.4321"))
    assert await started("32.4321")
    sandbox.close()
    result = await running
    assert result.exit_code == 137
    assert await gone("32.4321")
    assert not sandbox.folder.exists()
    with pytest.raises(SandboxError, match="closed"):
        await sandbox.run("true")


async def test_closing_while_bwrap_starts_kills_the_command(runtime, monkeypatch):
    """close() between the process's spawn and its registration (the spawn is awaited): the
    command must not go on running, in a folder that is gone."""
    sandbox = await runtime.create({})
    spawn = asyncio.create_subprocess_exec

    async def spawn_then_close(*args, **kwargs):
        process = await spawn(*args, **kwargs)
        sandbox.close()
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn_then_close)
    result = await asyncio.wait_for(sandbox.run("sleep 34.8765"), 30)
    # Killed by close(), not by the command's timeout (which a command left running would reach).
    assert result.exit_code == 137 and not result.timed_out
    assert await gone("34.8765")


WORKER = """
import asyncio, sys
from rlrun.env_server.runtimes.local import LocalRuntime

async def main():
    sandbox = await LocalRuntime(root=sys.argv[1], timeout_s=60).create({"f.txt": "x"})
    print(sandbox.folder, flush=True)
    if sys.argv[2] == "exit":
        sandbox.close()
        return
    await sandbox.run("sleep 33.5678")

asyncio.run(main())
"""


async def test_a_worker_killed_mid_command_leaves_no_process_and_its_folder_is_reaped(base):
    root = base / "sandboxes"
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        str(root),
        "hang",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert worker.stdout is not None
    folder = Path((await worker.stdout.readline()).decode().strip())
    assert await started("33.5678"), "the command never started"
    worker.send_signal(signal.SIGKILL)
    await worker.wait()
    assert await gone("33.5678")  # --die-with-parent and the pid namespace took them down
    assert exists(folder)  # a dead worker cleans nothing: its pool reaps it ...
    LocalRuntime(root=str(root)).reap(worker.pid)
    assert not exists(folder.parent)
    # ... or, when the pool died too, the next runtime to create a sandbox sweeps it.
    os.makedirs(folder)
    later = LocalRuntime(root=str(root))
    (await later.create({})).close()
    assert not exists(folder.parent)


async def test_a_sandbox_that_cannot_start_is_retried_then_a_sandbox_error(base):
    counter = base / "starts"
    flaky = base / "flaky-bwrap"
    flaky.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            echo x >> {counter}
            [ "$(wc -l < {counter})" -ge 3 ] && exec bwrap "$@"
            echo "bwrap: no mood" >&2; exit 1
            """
        )
    )
    flaky.chmod(0o755)
    counter.touch()
    counter.chmod(0o666)
    runtime = LocalRuntime(root=str(base / "s"), bwrap=str(flaky), retries=2, retry_backoff_s=0)
    sandbox = await runtime.create({})
    try:
        assert (await sandbox.run("echo third time")).stdout == "third time\n"
        counter.write_text("")
        strict = LocalRuntime(root=str(base / "s"), bwrap=str(flaky), retries=1, retry_backoff_s=0)
        strict_box = await strict.create({})
        with pytest.raises(SandboxError, match="no mood"):
            await strict_box.run("true")
        strict_box.close()
    finally:
        sandbox.close()


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"type": "locl"}, "type"),
        ({}, "type"),
        ({"type": "local", "memroy_mb": 5}, "memroy_mb"),
        ({"type": "local", "memory_mb": 0}, "memory_mb"),
        ({"type": "local", "retries": -1}, "retries"),
        ({"type": "local", "bwrap": "no-such-bwrap"}, "bwrap"),
        ({"type": "local", "root": "/root/sandboxes"}, "root"),
    ],
)
def test_runtime_options_are_checked_naming_the_field(config, field):
    with pytest.raises(RuntimeOptionError) as caught:
        make_runtime(config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"runtime.{field}: ")


async def test_a_process_that_exits_leaves_no_folder(base):
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        str(base),
        "exit",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert worker.stdout is not None
    folder = Path((await worker.stdout.readline()).decode().strip())
    assert await worker.wait() == 0
    assert folder.parent.parent == base and not exists(folder.parent)
