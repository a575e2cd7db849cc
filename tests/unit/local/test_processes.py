"""The launcher's process supervision, with stand-in children (real services are covered by e2e)."""

import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlrun.local.processes import (
    ChildFailed,
    ProcessGroup,
    describe_exit,
    raise_autogroup_priority,
    with_port,
)

READY_THEN_SLEEP = (
    "import sys, time; print('rlrun fake listening on 127.0.0.1:4321', flush=True); time.sleep(60)"
)
SERVICE_LIKE = (  # what `rlrun serve` does first
    "from rlrun.common.service import stop_with_launcher; stop_with_launcher(); " + READY_THEN_SLEEP
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
    assert group.exited() == []
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


def test_a_service_that_says_why_it_cannot_start_is_named_by_that_line_alone(tmp_path):
    group = ProcessGroup(dict(os.environ))
    script = (
        "import sys; print('some log line', file=sys.stderr); "
        "print('rlrun serve inference: cannot bind the gRPC server to 127.0.0.1:5 (--port): taken', "
        "file=sys.stderr); sys.exit(1)"
    )
    with pytest.raises(ChildFailed) as error:
        group.start("inference", [sys.executable, "-c", script], tmp_path / "i.log")
    assert str(error.value) == (
        "inference exited with code 1 before it was ready: cannot bind the gRPC server to "
        f"127.0.0.1:5 (--port): taken (its log: {tmp_path / 'i.log'})"
    )
    group.stop()


def test_a_child_that_closes_its_output_and_lingers_is_killed_not_waited_on(tmp_path):
    """What a replica that could not bind once did: stdout closed, the process still there."""
    group = ProcessGroup(dict(os.environ))
    script = "import os, time; os.close(1); time.sleep(600)"
    with pytest.raises(ChildFailed, match="closed its output before it was ready and did not exit") as error:
        group.start("inference", [sys.executable, "-c", script], tmp_path / "i.log")
    assert "killed it" in str(error.value)
    (child,) = group.children
    assert not alive(child.process.pid)
    group.stop()


def test_a_child_that_dies_later_is_detected(tmp_path):
    group = ProcessGroup(dict(os.environ))
    script = "import time; print('rlrun t listening on 127.0.0.1:1', flush=True); time.sleep(0.3); raise SystemExit(7)"
    child = group.start("trainer", [sys.executable, "-c", script], tmp_path / "trainer.log")
    child.process.wait(timeout=10)
    assert group.exited() == [child]
    assert describe_exit(child.process.returncode) == "exited with code 7"
    group.stop()


def test_a_dead_child_is_restarted_with_its_new_argv(tmp_path):
    group = ProcessGroup(dict(os.environ))
    child = group.start(
        "inference", [sys.executable, "-c", READY_THEN_SLEEP, "--port", "0"], tmp_path / "i.log"
    )
    first = child.process.pid
    os.kill(first, signal.SIGKILL)
    child.process.wait(timeout=10)
    assert describe_exit(child.process.returncode) == "was killed by SIGKILL"
    group.restart(child, with_port(child.argv, "4321"))
    try:
        assert child.process.pid != first and child.restarts == 1
        assert child.argv[-2:] == ["--port", "4321"] and child.address == "127.0.0.1:4321"
        assert group.exited() == []
    finally:
        group.stop()


def test_a_child_that_ignores_sigterm_is_killed(tmp_path):
    group = ProcessGroup(dict(os.environ))
    child = group.start("stubborn", [sys.executable, "-c", IGNORES_SIGTERM], tmp_path / "s.log")
    group.stop(grace_s=0.5)
    assert not alive(child.process.pid)


def test_children_die_with_a_killed_launcher(tmp_path):
    """Even SIGKILL of the launcher leaves no process behind (PR_SET_PDEATHSIG, which the
    service sets on itself)."""
    pid_file = tmp_path / "pid"
    launcher = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from rlrun.local.processes import ProcessGroup\n"
        "g = ProcessGroup(dict(os.environ))\n"
        f"c = g.start('fake', [sys.executable, '-c', {SERVICE_LIKE!r}], Path({str(tmp_path / 'f.log')!r}))\n"
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


def test_a_child_in_its_own_session_leads_it_and_the_others_share_the_launchers(tmp_path):
    group = ProcessGroup(dict(os.environ))
    shared = group.start("shared", [sys.executable, "-c", READY_THEN_SLEEP], tmp_path / "a.log")
    own = group.start("own", [sys.executable, "-c", IGNORES_SIGTERM], tmp_path / "b.log", own_session=True)
    try:
        assert os.getsid(own.process.pid) == own.process.pid
        assert os.getsid(shared.process.pid) == os.getsid(0)
        # Both lead a process group of their own, which is what stop() kills.
        assert os.getpgid(own.process.pid) == own.process.pid
        assert os.getpgid(shared.process.pid) == shared.process.pid
    finally:
        group.stop(grace_s=0.5)
    assert not alive(own.process.pid) and not alive(shared.process.pid)


def test_the_launcher_starts_only_the_trainer_in_a_session_of_its_own(tmp_path, monkeypatch):
    from rlrun.common.config import load_config
    from rlrun.local import launcher
    from rlrun.local.processes import Child

    started, prioritized = {}, []

    def fake_start(self, name, argv, log_file, ready_timeout_s=180.0, own_session=False):
        started[name] = own_session
        process = SimpleNamespace(pid=1000 + len(started))
        return Child(
            name=name, argv=argv, log_file=log_file, process=process, address=f"127.0.0.1:{len(started)}"
        )

    monkeypatch.setattr(ProcessGroup, "start", fake_start)
    monkeypatch.setattr(
        launcher, "raise_autogroup_priority", lambda pid, nice: prioritized.append((pid, nice))
    )
    config_path = launcher.Path(__file__).resolve().parents[3] / "configs" / "reverse_text.toml"
    config = load_config(config_path, [f"output_dir={tmp_path}"])
    launcher.LocalRun(config, config_path, []).start_services()
    trainer_pid = 1000 + list(started).index("trainer") + 1
    assert started.pop("trainer") is True
    assert started and not any(started.values())
    assert prioritized == [(trainer_pid, launcher.TRAINER_AUTOGROUP_NICE)]


def test_a_sessions_scheduling_group_gets_the_nice_value_when_the_kernel_allows(tmp_path):
    ours = Path("/proc/self/autogroup")
    ours_before = ours.read_text() if ours.exists() else None
    group = ProcessGroup(dict(os.environ))
    child = group.start("own", [sys.executable, "-c", READY_THEN_SLEEP], tmp_path / "a.log", own_session=True)
    try:
        autogroup = Path(f"/proc/{child.process.pid}/autogroup")
        if raise_autogroup_priority(child.process.pid, -5):
            assert autogroup.read_text().split()[-1] == "-5"
        else:  # no autogroups, or no CAP_SYS_NICE: nothing changed
            assert not autogroup.exists() or autogroup.read_text().split()[-1] == "0"
        # The launcher's own group (the user's terminal session) keeps its nice value.
        assert (ours.read_text() if ours.exists() else None) == ours_before
    finally:
        group.stop(grace_s=0.5)
