"""The launcher's process supervision, with stand-in children (real services are covered by e2e)."""

import os
import sys
import time

import pytest

from rlrun.local.processes import ChildFailed, ProcessGroup

READY_THEN_SLEEP = (
    "import sys, time; print('rlrun fake listening on 127.0.0.1:4321', flush=True); time.sleep(60)"
)
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('rlrun stubborn listening on 127.0.0.1:9', flush=True); time.sleep(60)"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:  # reaped between the two looks
        return False


def test_reads_the_address_from_the_ready_line_and_stops_everything(tmp_path):
    group = ProcessGroup(dict(os.environ))
    child = group.start("fake", [sys.executable, "-c", READY_THEN_SLEEP], tmp_path / "fake.log")
    assert child.address == "127.0.0.1:4321"
    group.check_alive()
    group.stop()
    assert child.process.poll() is not None


def test_a_child_that_dies_before_ready_is_named_with_its_log(tmp_path):
    group = ProcessGroup(dict(os.environ))
    script = "import sys; print('boom: bad config', file=sys.stderr); sys.exit(3)"
    with pytest.raises(ChildFailed) as error:
        group.start("env-server-x", [sys.executable, "-c", script], tmp_path / "env.log")
    message = str(error.value)
    assert "env-server-x exited with code 3 before it was ready" in message
    assert str(tmp_path / "env.log") in message and "boom: bad config" in message
    group.stop()


def test_a_child_that_dies_later_is_detected(tmp_path):
    group = ProcessGroup(dict(os.environ))
    script = "import time; print('rlrun t listening on 127.0.0.1:1', flush=True); time.sleep(0.3); raise SystemExit(7)"
    child = group.start("trainer", [sys.executable, "-c", script], tmp_path / "trainer.log")
    child.process.wait(timeout=10)
    with pytest.raises(ChildFailed, match="trainer exited unexpectedly with code 7"):
        group.check_alive()
    group.stop()


def test_a_child_that_ignores_sigterm_is_killed(tmp_path):
    group = ProcessGroup(dict(os.environ))
    child = group.start("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], tmp_path / "s.log")
    group.stop(grace_s=0.5)
    assert not alive(child.process.pid)


def test_children_die_with_a_killed_launcher(tmp_path):
    """Even SIGKILL of the launcher leaves no process behind (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "pid"
    launcher = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from rlrun.local.processes import ProcessGroup\n"
        "g = ProcessGroup(dict(os.environ))\n"
        f"c = g.start('fake', [sys.executable, '-c', {READY_THEN_SLEEP!r}], Path({str(tmp_path / 'f.log')!r}))\n"
        f"Path({str(pid_file)!r}).write_text(str(c.process.pid))\n"
        "time.sleep(60)\n"
    )
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)
