"""`rlrun bench gpu` in its CPU fallback, run as a user runs it (the console script): every
part runs, the table shows each figure against its baseline, and the last line is the JSON
whose ratios are each a positive finite quotient of two figures measured in the run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RLRUN = Path(sys.executable).parent / "rlrun"
FIGURES = {
    "served_tok_s",
    "generate_tok_s",
    "graph_limit_tok_s",
    "learner_tok_s",
    "bare_tok_s",
    "sync_gb_s",
    "copy_gb_s",
    "local_s_per_step",
    "local_tok_s",
}
RATIOS = {"served_vs_generate", "served_vs_graph_limit", "learner_vs_bare", "sync_vs_copy"}


def test_cpu_fallback_measures_every_part_against_its_baseline(tmp_path):
    assert RLRUN.exists(), f"the rlrun console script is not installed next to {sys.executable}"
    output = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLRUN_BENCH_DIR": str(tmp_path / "bench")}
    result = subprocess.run(
        [str(RLRUN), "bench", "gpu", "--cpu", "--quick", "--output", str(output)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == last
    assert (last["bench"], last["device"], last["fallback"], last["skipped"]) == ("gpu", "cpu", True, [])
    assert set(last) >= FIGURES | RATIOS | {"local_speedup_vs_reference", "elapsed_s"}
    for name in FIGURES:
        assert math.isfinite(last[name]) and last[name] > 0, name
    assert set(last["ratios"]) == RATIOS
    for name, (measured, baseline) in last["ratios"].items():
        assert math.isfinite(last[name]) and last[name] > 0, name
        assert last[name] == pytest.approx(last[measured] / last[baseline], rel=1e-12), name
    assert last["local_speedup_vs_reference"] == pytest.approx(3.1 / last["local_s_per_step"])
    assert last["local_steps"] >= 1 and last["sync_bytes"] > 0
    # The table and a progress line per part.
    for baseline in ("transformers generate", "eager decode loop", "bare training loop", "device copy"):
        assert baseline in result.stdout, baseline
    for part in ("learner:", "served:", "sync:", "generate:", "graph:", "local:"):
        assert part in result.stderr, part
