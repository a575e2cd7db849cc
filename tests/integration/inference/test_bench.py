"""`rlrun bench inference --quick` runs end to end and ends with its JSON line."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quick_bench_prints_the_ratios(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLRUN_BENCH_DIR": str(tmp_path)}
    output = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, "-m", "rlrun.cli", "bench", "inference", "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    )
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == last
    # what it measures, as it goes, on stderr
    for stage in (
        "(a) and (b), round 2 of 2",
        "(a) beside (b)'s gRPC traffic",
        "5 weight updates",
        "(c) sequential",
        "the larger model",
    ):
        assert stage in result.stderr
    for key in (
        "ratio_vs_limit",
        "ratio_vs_sequential",
        "weights_ratio_vs_raw",
        "weights_median_ratio_vs_raw",
        "engine_process_ratio_vs_limit",
        "grpc_ceiling_ratio_vs_limit",
        "limit_beside_grpc_ratio_vs_limit",
    ):
        assert last[key] > 0
    assert last["limit_beside_grpc_ratio_vs_limit"] == pytest.approx(
        last["limit_beside_grpc_tok_s"] / last["limit_tok_s"], abs=0.002
    )
    assert last["best_ratio_vs_limit_estimate"] == pytest.approx(
        last["grpc_ceiling_ratio_vs_limit"] * last["limit_beside_grpc_ratio_vs_limit"], abs=0.002
    )
    rounds = last["rounds"]
    assert len(rounds["ratio_vs_limit"]) == len(rounds["limit_tok_s"]) == 2
    paired = zip(rounds["ratio_vs_limit"], rounds["limit_tok_s"], rounds["service_tok_s"], strict=True)
    for ratio, limit, served in paired:
        assert ratio == pytest.approx(served / limit, abs=0.002)
    assert (
        min(rounds["ratio_vs_limit"]) <= last["ratio_vs_limit_median_round"] <= max(rounds["ratio_vs_limit"])
    )
    larger = last["larger_model"]
    assert larger["weight_bytes"] > 10 * last["weight_bytes"]  # a larger model than the demo's
    assert larger["ratio_vs_limit"] > 0 and larger["weights_ratio_vs_raw"] > 0
    assert larger["weights_median_ratio_vs_raw"] > 0
    for measured in (last, larger):
        # b/a splits into (b)'s batch occupancy and its step rate against (a)'s
        assert 0 < measured["service_rows_per_step"] <= last["batch"]
        assert measured["service_occupancy"] * measured["service_step_rate_vs_limit"] == pytest.approx(
            measured["ratio_vs_limit"], abs=0.005
        )
        # a request's time at its client splits into the engine's and the rest
        assert 0 < measured["service_first_token_ms"] < measured["service_engine_request_ms"]
        assert measured["service_engine_request_ms"] < measured["service_request_ms"]
        assert measured["service_outside_engine_ms"] == pytest.approx(
            measured["service_request_ms"] - measured["service_engine_request_ms"], abs=0.02
        )
