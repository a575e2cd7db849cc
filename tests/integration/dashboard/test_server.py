"""`rlrun dashboard` as a process, driven over real HTTP: what it serves, that it serves nothing
else (path traversal), that it follows a run's files, and who may read it (loopback Host
names; an API key off loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from rlrun.dashboard.runs import run_id
from rlrun.dashboard.security import COOKIE

REPO = Path(__file__).resolve().parents[3]
SECRET = "the-secret-b3f9"


def get_json(dash, path, **headers):
    status, _, body = dash.request("GET", path, headers)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def test_runs_curves_and_traces_are_served(run_folder, start_dashboard):
    with start_dashboard(str(run_folder.parent), "--isolated", "--port", "0") as dash:
        runs = get_json(dash, "/api/runs")["runs"]
        assert [(r["id"], r["name"], r["step"], r["phase"]) for r in runs] == [
            (run_id(run_folder), "demo", 3, "running")
        ]
        rid = runs[0]["id"]
        detail = get_json(dash, f"/api/runs/{rid}")
        assert detail["config"]["name"] == "demo" and detail["summary"] is None
        rows = get_json(dash, f"/api/runs/{rid}/metrics")["rows"]
        assert [r["reward_mean"] for r in rows] == [0.1, 0.2, 0.3]
        steps = get_json(dash, f"/api/runs/{rid}/traces")["steps"]
        assert steps == [{"phase": "rl", "step": n} for n in (1, 2, 3)]
        assert get_json(dash, f"/api/runs/{rid}/traces/rl/2")["groups"][0]["group_id"] == "g2"
        status, headers, page = dash.request("GET", "/")
        assert status == 200 and b"dashboard.js" in page
        assert "default-src 'self'" in headers["content-security-policy"]
        status, _, script = dash.request("GET", "/static/dashboard.js")
        assert status == 200 and b"function lineChart" in script


def test_a_live_run_is_followed_and_a_resumed_one_is_sent_again(run_folder, start_dashboard, make_run):
    """The page asks for the lines after the N it has, naming the N-th's time: new lines come
    alone; once the run went back to a checkpoint (its later lines rewritten), all of them."""
    outputs = make_run(run_folder, steps=0)
    with start_dashboard(str(run_folder), "--isolated", "--port", "0") as dash:
        rid = run_id(run_folder)
        rows = get_json(dash, f"/api/runs/{rid}/metrics")["rows"]
        last = rows[-1]["time"]
        outputs.append_metrics({"step": 4, "trainer_step": 4, "phase": "rl", "reward_mean": 0.4})
        more = get_json(dash, f"/api/runs/{rid}/metrics?after={len(rows)}&last={last!r}")
        assert not more["reset"] and [r["step"] for r in more["rows"]] == [4]
        outputs.resume_after(trainer_step=2, warmup_steps=0, rl_steps=2)
        outputs.append_metrics({"step": 3, "trainer_step": 3, "phase": "rl", "reward_mean": 0.35})
        outputs.append_metrics({"step": 4, "trainer_step": 4, "phase": "rl", "reward_mean": 0.45})
        again = get_json(dash, f"/api/runs/{rid}/metrics?after=4&last={more['rows'][-1]['time']!r}")
        assert again["reset"] and [r["reward_mean"] for r in again["rows"]] == [0.1, 0.2, 0.35, 0.45]
        status, _, body = dash.request("GET", f"/api/runs/{rid}/metrics?after=abc")
        assert status == 400 and json.loads(body)["field"] == "after"
        status, _, body = dash.request("GET", f"/api/runs/{rid}/traces/rl/one")
        assert status == 400 and json.loads(body)["field"] == "step"


def test_nothing_outside_the_run_folders_is_served(tmp_path, run_folder, start_dashboard):
    """Traversal in every spelling, and a link out of the run folder, find nothing; the files
    they aim at hold a marker that no answer may contain."""
    (tmp_path / "outputs" / "secret.jsonl").write_text(json.dumps({"step": 1, "leak": SECRET}) + "\n")
    (tmp_path / "secret.txt").write_text(SECRET)
    traces = run_folder / "traces"
    (traces / "rl_step_9.jsonl").symlink_to(tmp_path / "outputs" / "secret.jsonl")
    (run_folder / "error.txt").symlink_to(tmp_path / "secret.txt")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run_folder / "eval").symlink_to(outside)
    rid = run_id(run_folder)
    dotdot = quote("../", safe="")
    paths = [
        "/static/../../../secret.txt",
        f"/static/{dotdot}{dotdot}{dotdot}secret.txt",
        "/static/%2e%2e%2f%2e%2e%2fruns.py",
        "/static/..%5c..%5csecret.txt",
        "/static/....//....//secret.txt",
        "/static//etc/passwd",
        "/static/runs.py",
        "/static/app.py",
        "/../../secret.txt",
        "/%2e%2e/%2e%2e/secret.txt",
        "//etc/passwd",
        "/api/runs/..%2f..%2fsecret.txt",
        f"/api/runs/{rid}/../../../secret.txt",
        f"/api/runs/{rid}/traces/rl/9",
        f"/api/runs/{rid}/traces/rl/..%2f..%2f..%2fsecret",
        f"/api/runs/{rid}/traces/{dotdot}{dotdot}secret/1",
        f"/api/runs/{rid}/traces/rl%2f..%2f..%2f..%2fsecret/1",
        f"/api/runs/{rid}/traces/rl/1%2f..%2f..%2f..%2fsecret.txt",
        f"/api/runs/{rid}/traces/rl/-1",
        f"/api/runs/{rid}/traces/eval/1",
    ]
    with start_dashboard(str(tmp_path / "outputs"), "--isolated", "--port", "0") as dash:
        for path in paths:
            status, _, body = dash.request("GET", path)
            assert status in (400, 404), (path, status, body[:200])
            assert SECRET.encode() not in body, path
        detail = get_json(dash, f"/api/runs/{rid}")
        assert detail["error"] is None and SECRET not in json.dumps(detail)  # error.txt links out
        assert get_json(dash, f"/api/runs/{rid}/traces")["steps"] == [
            {"phase": "rl", "step": n} for n in (1, 2, 3)
        ] + [{"phase": "rl", "step": 9}]  # listed by name, but its content is not the run's
        runs = get_json(dash, "/api/runs")["runs"]
        assert [r["id"] for r in runs] == [rid]  # the stray secret.jsonl is no run
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, _, _ = dash.request(method, f"/api/runs/{rid}", body=b"")
            assert status == 405, method


def test_a_loopback_dashboard_answers_loopback_host_names_only(run_folder, start_dashboard):
    """A page on another site that points its own DNS name at 127.0.0.1 (DNS rebinding) gets
    nothing: the Host header names the site."""
    with start_dashboard(str(run_folder), "--isolated", "--port", "0") as dash:
        for host in ("evil.example", f"evil.example:{dash.port}", "127.0.0.1.nip.io", "10.0.0.1"):
            status, _, body = dash.request("GET", "/api/runs", {"Host": host})
            assert status == 421 and b"demo" not in body, host
        for host in (f"localhost:{dash.port}", f"127.0.0.1:{dash.port}", "[::1]", f"127.0.0.2:{dash.port}"):
            assert dash.request("GET", "/api/runs", {"Host": host})[0] == 200, host


def test_off_loopback_it_needs_the_runs_api_key(tmp_path, run_folder, start_dashboard):
    refused = subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "dashboard", str(run_folder), "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        refused.returncode == 2 and "--api-key-file" in refused.stderr and "Traceback" not in refused.stderr
    )
    key = "sk-run-4c1d"
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    args = (
        str(run_folder),
        "--isolated",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--api-key-file",
        str(key_file),
    )
    with start_dashboard(*args) as dash:
        rid = run_id(run_folder)
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": key},
            {"Cookie": f"{COOKIE}=x"},
        ):
            status, _, body = dash.request("GET", f"/api/runs/{rid}/metrics", headers)
            assert status == 401 and b"reward_mean" not in body, headers
        assert get_json(dash, f"/api/runs/{rid}/metrics", Authorization=f"Bearer {key}")["rows"]
        status, headers, _ = dash.request("GET", "/")
        assert status == 303 and headers["location"] == "/login"
        status, _, page = dash.request("GET", "/login")
        assert status == 200 and b'name="key"' in page
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        status, headers, _ = dash.request("POST", "/login", form, b"key=nope")
        assert status == 303 and headers["location"] == "/login?failed=1" and "set-cookie" not in headers
        status, headers, _ = dash.request("POST", "/login", form, f"key={key}".encode())
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"].split(";")[0]
        assert key not in cookie and "HttpOnly" in headers["set-cookie"]
        assert get_json(dash, "/api/runs", Cookie=cookie)["runs"][0]["id"] == rid
        assert dash.request("GET", "/", {"Cookie": cookie})[0] == 200
        assert dash.request("GET", "/health")[0] == 200  # the probe of `rlrun local` needs no key


def test_runs_registered_later_appear_without_a_restart(tmp_path, start_dashboard, make_run):
    """The registry of `rlrun local` runs is read on every listing."""
    home = tmp_path / "home"
    first, second = tmp_path / "a" / "first", tmp_path / "b" / "second"
    make_run(first, "first")
    make_run(second, "second")
    env = {"RLRUN_DASHBOARD_HOME": str(home)}
    register = [
        sys.executable,
        "-c",
        "import sys; from rlrun.dashboard import registry; registry.register(sys.argv[1])",
    ]
    subprocess.run([*register, str(first)], check=True, env={**os.environ, **env}, timeout=60)
    with start_dashboard("--port", "0", env=env) as dash:
        assert [r["name"] for r in get_json(dash, "/api/runs")["runs"]] == ["first"]
        subprocess.run([*register, str(second)], check=True, env={**os.environ, **env}, timeout=60)
        assert sorted(r["name"] for r in get_json(dash, "/api/runs")["runs"]) == ["first", "second"]
        assert oct(Path(home).stat().st_mode & 0o777) == "0o700"
        server = json.loads((home / "server.json").read_text())
        assert server == {"pid": dash.process.pid, "url": dash.url}
    assert not (home / "server.json").exists()  # its claim goes with it
