"""`rlrun bench operator-scale --quick`, run as a user runs it (the console script, from the
checkout): a real control plane with kwok nodes, the chart installed by helm, the operator as a
process of its own; 1 run, then 5 in one namespace, then 5 over 2. Every figure is measured (the
audit log's requests, the operator's own pass counter, /proc), every ratio is a quotient of two of
them, and once every run is up a status pass re-applies nothing."""

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
PHASES = {"baseline": (1, 1), "one_namespace": (5, 1), "namespaces": (5, 2)}
"""Each phase's (runs, namespaces) with --quick."""
READS = {"get", "list", "watch"}
STEADY_WRITES = {"patch secrets", "patch rlruns/status"}
"""What a status pass of a run that is up may write: the Secret it cannot read (applied blind;
an apply that changes nothing writes nothing) and the status."""


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert RLRUN.exists(), f"the rlrun console script is not installed next to {sys.executable}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(RLRUN), "bench", "operator-scale", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_quick_bench_measures_every_phase_against_its_baseline(tmp_path):
    output = tmp_path / "result.json"
    result = bench("--quick", "--output", str(output), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == last
    assert (last["benchmark"], last["quick"], last["runs"], last["namespaces"]) == (
        "operator-scale",
        True,
        5,
        2,
    )
    assert last["pods_per_run"] == 10 and last["operator_peak_rss_mib"] > 0
    for name, (runs, namespaces) in PHASES.items():
        phase = last["phases"][name]
        assert (phase["runs"], phase["namespaces"], phase["pods"]) == (runs, namespaces, runs * 10), name
        assert 0 < phase["latency_p50_s"] <= phase["latency_p99_s"] <= phase["latency_max_s"], name
        assert phase["latency_max_s"] < phase["right_s"], name  # the children come before the status
        # Every run was reconciled at least once, and each pass asked the API server something.
        assert phase["passes"] >= runs and phase["requests"] >= phase["passes"], name
        assert sum(phase["requests_per_pass_by_call"].values()) == pytest.approx(
            phase["requests_per_pass"], abs=0.05 * len(phase["requests_per_pass_by_call"])
        )
        assert phase["cpu_ms_per_pass"] > 0 and phase["operator_rss_mib"] > 0, name
        steady = phase["steady"]
        assert steady["passes"] > 0 and steady["requests_per_pass"] > 0, name
        writes = {call for call in steady["requests_per_pass_by_call"] if call.split()[0] not in READS}
        assert writes <= STEADY_WRITES, f"{name}: a status pass of runs that are up wrote {writes}"
    ratios = last["ratios"]
    assert set(ratios) >= {"latency_p50_s_5_vs_1", "requests_per_pass_5_vs_1", "requests_per_pass_2ns_vs_1ns"}
    phases = last["phases"]
    assert ratios["latency_p50_s_5_vs_1"] == pytest.approx(
        phases["one_namespace"]["latency_p50_s"] / phases["baseline"]["latency_p50_s"], abs=1e-3
    )
    assert ratios["requests_per_pass_2ns_vs_1ns"] == pytest.approx(
        phases["namespaces"]["requests_per_pass"] / phases["one_namespace"]["requests_per_pass"], abs=1e-3
    )
    for key, value in ratios.items():
        assert math.isfinite(value) and value > 0, key
    # The table, and a progress line per phase on stderr.
    for row in ("reconcile latency p50 (s)", "API requests per pass", "every status right after (s)"):
        assert row in result.stdout, row
    for progress in ("baseline: 1 runs", "one_namespace: 5 runs", "namespaces: 5 runs, 50 pods, 2 namespace"):
        assert progress in result.stderr, progress


def test_outside_a_checkout_it_says_what_it_needs(tmp_path):
    result = bench("--quick", cwd=tmp_path)
    assert result.returncode != 0
    assert "is not an rlrun checkout" in result.stderr and "--root" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
