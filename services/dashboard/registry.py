"""One dashboard per user on this machine, shared by every `rlrun local` run.

The registry is a folder only its user can write (mode 0700):
- `runs.json`: the run folders `rlrun local` registered, newest last; every dashboard started
  without `--isolated` serves them too, read again on every listing, so a run started later
  appears on the page that is already open;
- `server.json`: `{"pid", "url"}` of the dashboard that serves them (its claim). `rlrun local`
  prints that dashboard's address, or starts one in the background (`rlrun dashboard
  --background`, a session of its own: neither the run's Ctrl-C nor its end stops it; `rlrun
  dashboard --stop` does) when none answers.

A registered folder is served, so only the registry's user may register one. Where it lives:
$RLRUN_DASHBOARD_HOME, else $XDG_CACHE_HOME/rlrun/dashboard, else ~/.cache/rlrun/dashboard.

Nothing here imports the web stack: `rlrun local` uses it without the `serve` extra.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HOME_ENV = "RLRUN_DASHBOARD_HOME"
RUNS = "runs.json"
SERVER = "server.json"
LOG = "dashboard.log"
SERVICE = "rlrun-dashboard"
"""What the dashboard's /health answers as `service` (with its `pid`)."""
HEALTH_PATH = "/health"
MAX_RUNS = 200
"""Registered folders kept (the oldest go first)."""
START_TIMEOUT_S = 30.0


class DashboardUnavailable(RuntimeError):
    """No dashboard could be started; the message says why."""


def home() -> Path:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rlrun" / "dashboard"


def _home() -> Path:
    path = home()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    path = _home()
    with (path / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    tmp.replace(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def registered() -> list[Path]:
    """The run folders registered so far (oldest first)."""
    runs = _read_json(home() / RUNS)
    return [Path(p) for p in runs if isinstance(p, str)] if isinstance(runs, list) else []


def register(run_dir: Path) -> None:
    path = str(Path(run_dir).resolve())
    with _locked() as folder:
        runs = [str(p) for p in registered() if str(p) != path] + [path]
        _write_json(folder / RUNS, runs[-MAX_RUNS:])


def _health(url: str, timeout_s: float) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATH, timeout=timeout_s) as reply:
            body = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("service") == SERVICE else None


def live_server(timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The claimed dashboard, when it answers as the process that claimed it."""
    server = _read_json(home() / SERVER)
    if not isinstance(server, dict) or "url" not in server:
        return None
    health = _health(server["url"], timeout_s)
    return server if health is not None and health.get("pid") == server.get("pid") else None


def claim(url: str) -> dict[str, Any] | None:
    """Makes this process the registry's dashboard at `url`, unless another one answers: then
    that one's claim."""
    with _locked() as folder:
        other = live_server()
        if other is not None and other.get("pid") != os.getpid():
            return other
        _write_json(folder / SERVER, {"pid": os.getpid(), "url": url})
    return None


def release() -> None:
    """Withdraws this process's claim (on exit)."""
    with _locked() as folder:
        server = _read_json(folder / SERVER)
        if isinstance(server, dict) and server.get("pid") == os.getpid():
            (folder / SERVER).unlink(missing_ok=True)


def start_background() -> dict[str, Any]:
    """Starts `rlrun dashboard --background` in a session of its own and waits until a
    dashboard (that one, or another that won the race) answers; its claim."""
    log = _home() / LOG
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "rlrun.cli", "dashboard", "--background"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server = live_server(timeout_s=1.0)
        if server is not None:
            return server
        if process.poll() is not None and live_server(timeout_s=1.0) is None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise DashboardUnavailable(
                f"`rlrun dashboard --background` exited with {process.returncode}: "
                + (" / ".join(tail) or "no output")
                + f" (its log: {log})"
            )
        time.sleep(0.1)
    raise DashboardUnavailable(f"no dashboard answered within {START_TIMEOUT_S:.0f}s (its log: {log})")


def ensure(run_dir: Path) -> str:
    """Registers `run_dir` and returns the address of the dashboard that serves it (started
    when none answers)."""
    register(run_dir)
    server = live_server() or start_background()
    return str(server["url"])


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie waiting for its parent has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def stop(timeout_s: float = 10.0) -> int | None:
    """Stops the registry's dashboard (SIGTERM, then waits); its pid, or None when none answered."""
    server = live_server()
    if server is None:
        return None
    pid = int(server["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _running(pid):
            return pid
        time.sleep(0.05)
    raise DashboardUnavailable(f"the dashboard (pid {pid}) did not stop within {timeout_s:.0f}s")
