"""`rlrun dashboard` in a real browser against a real run: `rlrun local` (a few steps of the demo)
prints the dashboard's address and starts it; Debian's Chromium, driven by playwright-core
(tests/browser/dashboard.mjs), opens it while the run goes on. The page must follow the run
without a reload, draw the run's own points (metrics.jsonl), show a token's advantage as the
trace file records it, and render a screenshot that is not blank. Fails, never skips, without
Chromium or Node: `make setup` installs both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from rlrun.dashboard import registry

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "reverse_text.toml"
BROWSER = REPO / "tests" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
ADDRESS = re.compile(r"rlrun local: dashboard (http://\S+)")


def browser_tools() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, f"node and npm are needed (node: {node}, npm: {npm}); `make setup` installs them"
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make setup` installs Debian's chromium"
    if not (BROWSER / "node_modules" / "playwright-core").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=BROWSER, check=True, timeout=600)
    return node


def branch_advantage(trace: dict, index: int) -> tuple[float, bool]:
    """The RL advantage of token `index` of the trace's first branch, and whether it trains,
    read from the trace file's own arrays."""
    branch = trace["branches"][0]
    value = sum(c["values"][index] for c in branch["channels"] if c["loss"] == "LOSS_TYPE_RL")
    return value, branch["mask"][index]


def check_trace_files(out: Path, rows: list[dict], dumped: tuple[int, ...]) -> None:
    """The trace files against what else the run wrote and a third-party tokenizer: their traces
    are the rollout dumps' (same step, same id), their token texts Hugging Face's decoding of
    each id, their dropped groups the metrics lines' counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(REPO / "configs" / "tokenizer" / "lowercase")
    for step in dumped:
        dump = {
            r["id"]: r
            for r in map(json.loads, (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines())
        }
        groups = [
            json.loads(line) for line in (out / "traces" / f"rl_step_{step}.jsonl").read_text().splitlines()
        ]
        trained = [g for g in groups if g["dropped"] is None]
        assert len(trained) == 2 and all(len(g["traces"]) == 8 for g in trained)
        for group in trained:
            assert all(trace == dump[trace["id"]] for trace in group["traces"])
            ids = {tok for t in group["traces"] for n in t["nodes"] for tok in n["tokenIds"]}
            assert {int(k) for k in group["tokens"]} == ids
            assert all(text == tokenizer.decode([int(k)]) for k, text in group["tokens"].items())
    dropped = [
        g
        for f in sorted((out / "traces").glob("rl_step_*.jsonl"))
        for g in map(json.loads, f.read_text().splitlines())
        if g["dropped"]
    ]
    assert all(
        g["dropped"]["reason"] == "stale" and "max_off_policy_steps" in g["dropped"]["detail"]
        for g in dropped
    )
    rl = [r for r in rows if r["phase"] == "rl"]
    assert sum(r.get("groups_dropped/stale", 0) for r in rl) == rl[-1]["groups_dropped_stale"]
    warm = [json.loads(line) for line in (out / "traces" / "warmup_step_1.jsonl").read_text().splitlines()]
    assert warm and all(
        c["loss"] == "LOSS_TYPE_CE"
        for g in warm
        for t in g["traces"]
        for b in t["branches"]
        for c in b["channels"]
    )
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start"]


def blank(path: Path) -> bool:
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64)
    return pixels.std() < 10 or len(np.unique(pixels.reshape(-1, 3), axis=0)) < 50


def test_the_dashboard_follows_a_live_run_in_chromium(tmp_path):
    node = browser_tools()
    out, shots = tmp_path / "run", tmp_path / "shots"
    shots.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    steps = 8
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlrun.cli",
            "local",
            str(DEMO),
            "--output-dir",
            str(out),
            "--max-steps",
            str(steps),
            "--no-progress",
            "--set",
            "orchestrator.eval.interval=4",
            "--set",
            "orchestrator.eval.num_tasks=64",
            "--set",
            "orchestrator.save_rollouts_interval=4",
            "--set",
            "orchestrator.warm_start.max_steps=6",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    found = threading.Event()

    def read_stderr():
        assert run.stderr is not None
        for line in run.stderr:
            stderr.append(line)
            if ADDRESS.search(line):
                found.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert found.wait(120), "".join(stderr)[-3000:]
        url = next(m[1] for line in stderr if (m := ADDRESS.search(line)))
        page = subprocess.run(
            [node, str(BROWSER / "dashboard.mjs"), url, str(shots)],
            cwd=BROWSER,
            capture_output=True,
            text=True,
            timeout=900,
        )
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    reader.join(10)
    assert run.returncode == 0, "".join(stderr)[-3000:]
    assert page.returncode == 0, page.stderr[-3000:]
    seen = json.loads(page.stdout.strip().splitlines()[-1])
    assert "failure" not in seen, seen["failure"]
    assert seen["errors"] == [], seen["errors"]

    # Live: opened while the run went on, the curve grew on the same page load.
    assert seen["reloads"] == 1 and seen["later_points"] > seen["first_points"] >= 1, seen
    assert seen["phase"] == "succeeded"

    # The curves are the run's own points.
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [(r["step"], r["reward_mean"]) for r in rows if r["phase"] == "rl"]
    evals = [(r["step"], r["eval_reward"]) for r in rows if r["phase"] == "eval"]
    series = {s["name"]: s for s in seen["reward"]}
    train = series["train reward (mean over rollouts)"]
    assert [tuple(p) for p in train["points"]] == rl and len(rl) == steps
    assert train["vertices"] == len(rl)  # one vertex of the drawn path per step
    assert [tuple(p) for p in series["eval reward (held-out)"]["points"]] == evals and len(evals) >= 3
    assert {"staleness", "throughput", "step-time", "warm-start"} <= set(seen["charts"])

    # A token's advantage, as the page shows it, is the trace file's.
    phase, step = seen["step"].split(":")
    assert (phase, int(step)) == ("rl", steps)  # the viewer follows the newest step
    groups = [
        json.loads(line) for line in (out / "traces" / f"rl_step_{step}.jsonl").read_text().splitlines()
    ]
    trace = next(t for t in groups[seen["group"]]["traces"] if t["id"] == seen["trace"])
    advantage, trains = branch_advantage(trace, seen["token_index"])
    assert trains and seen["kind_text"] == "RL channel"
    assert abs(float(seen["advantage_text"]) - advantage) < 5e-5, (seen["advantage_text"], advantage)
    assert seen["logprob_text"] != "–"

    check_trace_files(out, rows, dumped=(4, 8))
    for name in ("curves.png", "traces.png"):
        assert not blank(shots / name), name
    stopped = registry.stop()  # the session's dashboard (a later `rlrun local` starts another)
    assert stopped is not None and registry.live_server() is None
