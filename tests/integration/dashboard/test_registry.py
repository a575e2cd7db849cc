"""One dashboard per user, shared by the runs `rlrun local` registers: started in the background
when none answers, reused while it does, never doubled, stopped by `rlrun dashboard --stop`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from rlrun.dashboard import registry

REPO = Path(__file__).resolve().parents[3]


def rlrun(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlrun.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_the_first_run_starts_the_dashboard_and_the_next_ones_share_it(tmp_path, monkeypatch, make_run):
    monkeypatch.setenv(registry.HOME_ENV, str(tmp_path / "home"))
    first, second = tmp_path / "first", tmp_path / "second"
    make_run(first, "first")
    make_run(second, "second")
    url = registry.ensure(first)
    server = registry.live_server()
    assert server is not None and server["url"] == url
    try:
        assert registry.ensure(second) == url and registry.live_server()["pid"] == server["pid"]
        assert registry.registered() == [first.resolve(), second.resolve()]
        registry.register(first)  # again: it moves to the end, once
        assert registry.registered() == [second.resolve(), first.resolve()]
        with urllib.request.urlopen(f"{url}/api/runs", timeout=10) as reply:
            assert sorted(r["name"] for r in json.loads(reply.read())["runs"]) == ["first", "second"]
        late = rlrun("dashboard", "--background")  # a second background one steps aside
        assert late.returncode == 0 and f"{url} already serves the registered runs" in late.stderr
        assert registry.live_server()["pid"] == server["pid"]
    finally:
        stopped = rlrun("dashboard", "--stop")
    assert stopped.returncode == 0 and f"stopped pid {server['pid']}" in stopped.stderr
    assert registry.live_server() is None and not (tmp_path / "home" / "server.json").exists()
    assert rlrun("dashboard", "--stop").stderr.strip() == "rlrun dashboard: none was running"


def test_a_stale_claim_is_taken_over(tmp_path, monkeypatch, make_run):
    """server.json naming a process that is gone (a killed dashboard) does not block the next."""
    home = tmp_path / "home"
    monkeypatch.setenv(registry.HOME_ENV, str(home))
    home.mkdir(mode=0o700)
    (home / "server.json").write_text(json.dumps({"pid": 999_999_999, "url": "http://127.0.0.1:9"}))
    make_run(tmp_path / "run")
    try:
        url = registry.ensure(tmp_path / "run")
        assert registry.live_server()["url"] == url != "http://127.0.0.1:9"
        assert registry.live_server()["pid"] != 999_999_999
    finally:
        registry.stop()
    assert not os.path.exists(home / "server.json")
