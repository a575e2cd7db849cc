"""Every `rlrun bench` as a new user runs it: the console script, `--quick`, in a fresh checkout
(no earlier outputs: `rlrun bench orchestrator` once crashed there, on a path no test ran
because each test passed files of its own). Each ends with its JSON line, also written to
`--output`, and its ratios are what it says they are: each a quotient of two figures measured
in the same run. The benchmarks that take minutes on a 2-core machine are marked slow."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable

import pytest

from rlrun.cli import BENCHMARKS

from ..support.checkout import BIN, fresh_checkout, user_env

Check = Callable[[dict, subprocess.CompletedProcess], None]


def check_inference(last: dict, result: subprocess.CompletedProcess) -> None:
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


def check_env_server(last: dict, result: subprocess.CompletedProcess) -> None:
    assert math.isfinite(last["overhead_per_rollout_ms"])
    assert last["direct_step_ms"] > 0 and last["env_server_step_ms"] > 0
    assert last["step_ratio_vs_direct"] == pytest.approx(last["env_server_step_ms"] / last["direct_step_ms"])


def check_memory(last: dict, result: subprocess.CompletedProcess) -> None:
    for name in ("env_server", "inference"):
        mb = last[f"{name}_rss_mb"]
        assert len(mb) == last["rounds"] and all(m > 0 for m in mb)
        assert last[f"{name}_rss_ratio"] == pytest.approx(mb[-1] / mb[1])
        assert last[f"{name}_growth_mb"] == pytest.approx(mb[-1] - mb[1])


def check_trainer(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["ratio_vs_bare_loop"] > 0 and last["broadcast_ratio_vs_raw"] > 0
    assert last["broadcast_bytes"] > 0 and last["tokens_per_step"] > 0


def check_orchestrator(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["traces_per_s"] > 0 and last["ratio_vs_bare"] > 0
    # No demo output in a fresh checkout: the step time is the measured lower bound.
    assert last["demo_step_source"].startswith("measured lower bound")
    assert last["share_of_step"] == pytest.approx(last["demo_batch_build_ms"] / last["demo_step_ms"])
    assert "recorded_share_of_step" not in last


def check_async(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["speedup"] == pytest.approx(last["sync_step_ms"] / last["async_step_ms"])
    assert last["bound"] == pytest.approx(
        (last["gen_ms"] + last["train_ms"]) / max(last["gen_ms"], last["train_ms"])
    )
    assert last["ratio_vs_bound"] == pytest.approx(last["speedup"] / last["bound"])


def check_stack(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["stack_vs_in_process"] == pytest.approx(last["stack_step_ms"] / last["in_process_step_ms"])


def check_verifiers(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["env_server_step_ratio"] == pytest.approx(
        last["env_server_verifiers_step_ms"] / last["env_server_native_step_ms"]
    )
    assert last["rl_step_ratio"] == pytest.approx(last["rl_verifiers_step_ms"] / last["rl_native_step_ms"])
    assert last["overhead_per_rollout_ms"] == pytest.approx(
        (last["env_server_verifiers_step_ms"] - last["env_server_native_step_ms"])
        / last["env_server_rollouts_per_step"]
    )
    for kind in ("native", "verifiers"):
        assert last[f"{kind}_env_server_cpu_ms_per_rollout"] > 0, kind
        assert last[f"{kind}_inference_cpu_ms_per_rollout"] > 0, kind


GPU_FIGURES = {
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
GPU_RATIOS = {"served_vs_generate", "served_vs_graph_limit", "learner_vs_bare", "sync_vs_copy"}


def check_gpu(last: dict, result: subprocess.CompletedProcess) -> None:
    """Its CPU fallback (`--cpu`): every part runs, the table shows each figure against its
    baseline, and each ratio is a positive finite quotient of two figures of the run."""
    assert (last["bench"], last["device"], last["fallback"], last["skipped"]) == ("gpu", "cpu", True, [])
    assert set(last) >= GPU_FIGURES | GPU_RATIOS | {"local_speedup_vs_reference", "elapsed_s"}
    for name in GPU_FIGURES:
        assert math.isfinite(last[name]) and last[name] > 0, name
    assert set(last["ratios"]) == GPU_RATIOS
    for name, (measured, baseline) in last["ratios"].items():
        assert math.isfinite(last[name]) and last[name] > 0, name
        assert last[name] == pytest.approx(last[measured] / last[baseline], rel=1e-12), name
    assert last["local_speedup_vs_reference"] == pytest.approx(3.1 / last["local_s_per_step"])
    assert last["local_steps"] >= 1 and last["sync_bytes"] > 0
    for baseline in ("transformers generate", "eager decode loop", "bare training loop", "device copy"):
        assert baseline in result.stdout, baseline
    for part in ("learner:", "served:", "sync:", "generate:", "graph:", "local:"):
        assert part in result.stderr, part


CHECKS: dict[str, Check] = {
    "inference": check_inference,
    "env-server": check_env_server,
    "memory": check_memory,
    "trainer": check_trainer,
    "orchestrator": check_orchestrator,
    "async": check_async,
    "stack": check_stack,
    "verifiers": check_verifiers,
    "gpu": check_gpu,
}
OPTIONS = {"gpu": ["--cpu"]}
SLOW = {"inference", "env-server", "memory", "async", "stack", "verifiers"}
"""Minutes each on this 2-core machine (make test-slow runs them)."""


def test_every_benchmark_is_run_here():
    assert set(CHECKS) == set(BENCHMARKS)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in sorted(CHECKS)]
)
def test_the_benchmark_runs_quick_on_a_fresh_checkout(tmp_path, name):
    checkout = fresh_checkout(tmp_path / "checkout")
    assert not (checkout / "outputs").exists()
    output = tmp_path / "result.json"
    result = subprocess.run(
        [str(BIN / "rlrun"), "bench", name, "--quick", *OPTIONS.get(name, []), "--output", str(output)],
        cwd=checkout,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == last
    CHECKS[name](last, result)
