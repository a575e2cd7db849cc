"""Every `rlrun bench` as a new user runs it: the console script, `--quick`, in a fresh checkout
(no earlier outputs: `rlrun bench orchestrator` once crashed there, on a path no test ran
because each test passed files of its own). Each ends with its JSON line, also written to
`--output`, and its ratios are what it says they are: each a quotient of two figures measured
in the same run. The benchmarks that take minutes on a 2-core machine are marked slow."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable

import pytest

from rlrun.cli import BENCHMARKS

from ..support.checkout import BIN, REPO, fresh_checkout, user_env

sys.path.insert(0, str(REPO / "tests" / "support"))  # as tests/operator/conftest.py does

from kubecluster.processes import TOOLS  # noqa: E402

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


SCALE_PHASES = {"baseline": (1, 1), "one_namespace": (5, 1), "namespaces": (5, 2)}
"""Each phase's (runs, namespaces) with --quick."""
READS = {"get", "list", "watch"}
STEADY_WRITES = {"patch secrets", "patch rlruns/status"}
"""What a status pass of a run that is up may write: the Secret it cannot read (applied blind;
an apply that changes nothing writes nothing) and the status."""
SCALE_RATIOS = {
    "latency_p50_s",
    "latency_p99_s",
    "pods_created_s",
    "right_s",
    "passes_per_run",
    "requests_per_pass",
    "steady_requests_per_pass",
    "steady_requests_per_run_per_min",
    "steady_cpu_ms_per_pass",
    "steady_passes_vs_wanted",
}


def scale_figure(phase: dict, name: str) -> float:
    return phase["steady"][name.removeprefix("steady_")] if name.startswith("steady_") else phase[name]


def check_operator_scale(last: dict, result: subprocess.CompletedProcess) -> None:
    """A real control plane with kwok nodes, the chart installed by helm, the operator as a
    process of its own; 1 run, then 5 in one namespace, then 5 over 2. Every figure is measured
    (the audit log's requests and creates, the operator's own pass counter, /proc), every ratio
    is a quotient of two of them, and once every run is up a status pass re-applies nothing."""
    assert (last["benchmark"], last["quick"], last["runs"], last["namespaces"]) == (
        "operator-scale",
        True,
        5,
        2,
    )
    assert last["pods_per_run"] == 10 and last["operator_peak_rss_mib"] > 0
    phases = last["phases"]
    for name, (runs, namespaces) in SCALE_PHASES.items():
        phase = phases[name]
        assert (phase["runs"], phase["namespaces"], phase["pods"]) == (runs, namespaces, runs * 10), name
        assert 0 < phase["latency_p50_s"] <= phase["latency_p99_s"] <= phase["latency_max_s"], name
        # The children come before their pods, the pods before every status is right.
        assert phase["latency_max_s"] < phase["pods_created_s"] < phase["right_s"], name
        # Every run was reconciled at least once, and each pass asked the API server something.
        assert phase["passes"] >= runs and phase["requests"] >= phase["passes"], name
        assert phase["passes_per_run"] == pytest.approx(phase["passes"] / runs, abs=0.01), name
        assert sum(phase["requests_per_pass_by_call"].values()) == pytest.approx(
            phase["requests_per_pass"], abs=0.05 * len(phase["requests_per_pass_by_call"])
        )
        assert phase["cpu_ms_per_pass"] > 0 and phase["operator_rss_mib"] > 0, name
        steady = phase["steady"]
        assert steady["passes"] > 0 and steady["requests_per_pass"] > 0, name
        assert steady["requests_per_run_per_min"] > 0, name
        writes = {call for call in steady["requests_per_pass_by_call"] if call.split()[0] not in READS}
        assert writes <= STEADY_WRITES, f"{name}: a status pass of runs that are up wrote {writes}"
    ratios = last["ratios"]
    base, one, spread = (phases[name] for name in SCALE_PHASES)
    assert set(ratios) == {f"{f}_5_vs_1" for f in SCALE_RATIOS} | {f"{f}_2ns_vs_1ns" for f in SCALE_RATIOS}
    for figure in SCALE_RATIOS:
        for key, (measured, baseline) in {
            f"{figure}_5_vs_1": (one, base),
            f"{figure}_2ns_vs_1ns": (spread, one),
        }.items():
            value = ratios[key]
            assert math.isfinite(value) and value > 0, key
            assert value == pytest.approx(
                scale_figure(measured, figure) / scale_figure(baseline, figure), rel=1e-2, abs=2e-3
            ), key
    # The table, and a progress line per phase on stderr.
    for row in ("reconcile latency p50 (s)", "every pod created after (s)", "reconcile passes per run"):
        assert row in result.stdout, row
    for progress in ("baseline: 1 runs", "one_namespace: 5 runs", "namespaces: 5 runs, 50 pods, 2 namespace"):
        assert progress in result.stderr, progress


def check_sandbox(last: dict, result: subprocess.CompletedProcess) -> None:
    assert last["sandboxes_per_s"] > 0 and last["sandboxes_with_command_per_s"] > 0
    assert last["ratio_vs_direct"] == pytest.approx(last["command_ms"] / last["direct_ms"])
    assert last["python_ratio_vs_direct"] == pytest.approx(
        last["python_command_ms"] / last["python_direct_ms"]
    )
    for stage in ("sandboxes created and destroyed", "sandboxed vs direct"):
        assert stage in result.stderr


CHECKS: dict[str, Check] = {
    "inference": check_inference,
    "env-server": check_env_server,
    "sandbox": check_sandbox,
    "memory": check_memory,
    "trainer": check_trainer,
    "orchestrator": check_orchestrator,
    "async": check_async,
    "stack": check_stack,
    "verifiers": check_verifiers,
    "gpu": check_gpu,
    "operator-scale": check_operator_scale,
}
OPTIONS = {"gpu": ["--cpu"]}
ENV = {"operator-scale": {"RLRUN_K8S_TOOLS": str(TOOLS)}}
"""A fresh checkout has no `make k8s-tools` output: the bench uses this checkout's binaries."""
SLOW = {"inference", "env-server", "memory", "async", "stack", "verifiers", "operator-scale"}
"""Minutes each on this 2-core machine (make test-slow runs them). operator-scale takes 1.5 min
with its control plane; tests/operator/test_requests.py holds its request counts for one run
in the default suite."""


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
        env=user_env(**ENV.get(name, {})),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == last
    CHECKS[name](last, result)


def test_operator_scale_outside_a_checkout_says_what_it_needs(tmp_path):
    result = subprocess.run(
        [str(BIN / "rlrun"), "bench", "operator-scale", "--quick"],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "is not an rlrun checkout" in result.stderr and "--root" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
