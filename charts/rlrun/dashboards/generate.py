"""The chart's Grafana dashboards as code: `python charts/rlrun/dashboards/generate.py` writes
run-overview.json and services.json beside this file (tests/chart checks they are in step).

Every query filters on `namespace` and `run`, the labels both the chart's ServiceMonitor or
PodMonitor and `rlrun local`'s prometheus_targets.json put on each series; `instance` is the pod
in a cluster (host:port locally), `component` the service kind. Each panel has one unit for all
its queries, and each legend names every label its query groups by.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
S = '{namespace="$namespace", run=~"$run"}'
R = "[$__rate_interval]"
# A series every run exports from its orchestrator's start: it lists the namespaces and runs.
RUN_SERIES = "rlrun_orchestrator_policy_version"


def quantiles(metric: str, by: str = "run", label: str = "") -> list[tuple[str, str]]:
    inner = f"sum by ({by}, le) (rate({metric}_bucket{S}{R}))"
    legend = " ".join(f"{{{{{b.strip()}}}}}" for b in by.split(",")) + (f" {label}" if label else "")
    return [(f"histogram_quantile({q}, {inner})", f"{legend} p{round(q * 100)}") for q in (0.5, 0.9)]


def rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{S}{R}))"


def panel(title: str, description: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
            "overrides": [],
        },
        "options": {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": [
            {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard(uid: str, title: str, description: str, panels: list[dict]) -> dict:
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8}
    variable = {"type": "query", "datasource": DATASOURCE, "refresh": 2}
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["rlrun"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
                {
                    **variable,
                    "name": "namespace",
                    "label": "Namespace",
                    "query": {"query": f"label_values({RUN_SERIES}, namespace)", "refId": "namespace"},
                },
                {
                    **variable,
                    "name": "run",
                    "label": "Run",
                    "query": {
                        "query": f'label_values({RUN_SERIES}{{namespace="$namespace"}}, run)',
                        "refId": "run",
                    },
                    "multi": True,
                    "includeAll": True,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def run_overview() -> dict:
    return dashboard(
        "rlrun-run-overview",
        "rlrun / Run overview",
        "Reward, progress, step time, staleness, throughput, env errors and weight broadcast time of RLRuns.",
        [
            panel(
                "Reward",
                "Mean reward of the last RL batch (train) and of the last eval or warm-start dev check.",
                "none",
                [
                    (f"max by (run) (rlrun_orchestrator_train_reward_mean{S})", "{{run}} train"),
                    (f"max by (run) (rlrun_orchestrator_eval_reward_mean{S})", "{{run}} eval"),
                ],
            ),
            panel(
                "Steps",
                "Warm-start and RL steps done, and the policy version; flat lines mean a stall "
                "(alert RLRunStepStalled).",
                "none",
                [
                    (f"max by (run) (rlrun_orchestrator_rl_steps{S})", "{{run}} RL steps"),
                    (f"max by (run) (rlrun_orchestrator_warmup_steps{S})", "{{run}} warm-start steps"),
                    (f"max by (run) (rlrun_orchestrator_policy_version{S})", "{{run}} policy version"),
                ],
            ),
            panel(
                "Trainer step time",
                "Duration of one trained batch (all its optimizer steps), median and 90th percentile.",
                "s",
                quantiles("rlrun_trainer_step_seconds"),
            ),
            panel(
                "Off-policy staleness",
                "Policy versions between a trained group's generation and the version it trains at "
                "(mean), against the run's bound max_off_policy_steps.",
                "none",
                [
                    (
                        f"{rate('rlrun_orchestrator_off_policy_steps_sum', 'run')} / "
                        f"{rate('rlrun_orchestrator_off_policy_steps_count', 'run')}",
                        "{{run}} mean",
                    ),
                    (f"max by (run) (rlrun_orchestrator_max_off_policy_steps{S})", "{{run}} bound"),
                ],
            ),
            panel(
                "Staleness drops",
                "Groups dropped whole because they grew older than max_off_policy_steps (wasted "
                "generation; alert RLRunGroupsDroppedStale).",
                "cps",
                [
                    (
                        rate("rlrun_orchestrator_groups_dropped_stale_total", "run, env"),
                        "{{run}} {{env}} groups dropped/s",
                    )
                ],
            ),
            panel(
                "Tokens per second",
                "Tokens the inference replicas generate, and tokens the trainer trains on (last batch).",
                "cps",
                [
                    (rate("rlrun_inference_generated_tokens_total", "run"), "{{run}} generated tokens/s"),
                    (
                        f"sum by (run) (rlrun_trainer_throughput_tokens_per_second{S})",
                        "{{run}} trained tokens/s",
                    ),
                ],
            ),
            panel(
                "Rollouts and rollout errors per env",
                "Rollouts the env-servers return, and those that came back with an error "
                "(cancelled ones aside), per environment.",
                "cps",
                [
                    (rate("rlrun_env_server_rollouts_total", "run, env"), "{{run}} {{env}} rollouts/s"),
                    (
                        rate("rlrun_env_server_failed_rollouts_total", "run, env"),
                        "{{run}} {{env}} failed rollouts/s",
                    ),
                ],
            ),
            panel(
                "Rollout error ratio per env",
                "Fraction of each environment's rollouts that fail (alert RLRunEnvErrorRateHigh).",
                "percentunit",
                [
                    (
                        f"{rate('rlrun_env_server_failed_rollouts_total', 'run, env')} / "
                        f"{rate('rlrun_env_server_rollouts_total', 'run, env')}",
                        "{{run}} {{env}}",
                    )
                ],
            ),
            panel(
                "Weight broadcast time",
                "Trainer: a weight broadcast to all inference replicas. Inference: an update from its "
                "first message to committed.",
                "s",
                quantiles("rlrun_trainer_weight_broadcast_seconds", label="broadcast")
                + quantiles("rlrun_inference_weight_update_seconds", label="inference update"),
            ),
            panel(
                "Weight bytes broadcast",
                "Weight bytes the trainer delivers to the inference replicas.",
                "Bps",
                [(rate("rlrun_trainer_weight_broadcast_bytes_total", "run"), "{{run}} broadcast")],
            ),
        ],
    )


def services() -> dict:
    return dashboard(
        "rlrun-services",
        "rlrun / Services",
        "Per-service view of RLRuns: env-servers, inference replicas, trainer and orchestrator.",
        [
            panel(
                "Trained rollouts per env",
                "Rollouts of trained groups the orchestrator receives, per environment.",
                "cps",
                [(rate("rlrun_orchestrator_rollouts_total", "run, env"), "{{run}} {{env}} rollouts/s")],
            ),
            panel(
                "Env-server rollouts in flight",
                "Rollouts running or waiting for a worker, per environment.",
                "short",
                [(f"sum by (run, env) (rlrun_env_server_in_flight_rollouts{S})", "{{run}} {{env}}")],
            ),
            panel(
                "Generated tokens per second by inference replica",
                "Tokens each inference replica generates.",
                "cps",
                [(rate("rlrun_inference_generated_tokens_total", "run, instance"), "{{run}} {{instance}}")],
            ),
            panel(
                "Inference request latency",
                "Generate latency, arrival to last sample finished.",
                "s",
                quantiles("rlrun_inference_request_latency_seconds"),
            ),
            panel(
                "Inference requests",
                "Requests in the batch and waiting for a slot, per replica.",
                "short",
                [
                    (
                        f"sum by (run, instance) (rlrun_inference_running_requests{S})",
                        "{{run}} {{instance}} running",
                    ),
                    (
                        f"sum by (run, instance) (rlrun_inference_waiting_requests{S})",
                        "{{run}} {{instance}} waiting",
                    ),
                ],
            ),
            panel(
                "Trainer step time (mean)",
                "Mean duration of a trained batch.",
                "s",
                [
                    (
                        f"{rate('rlrun_trainer_step_seconds_sum', 'run, instance')} / "
                        f"{rate('rlrun_trainer_step_seconds_count', 'run, instance')}",
                        "{{run}} {{instance}}",
                    )
                ],
            ),
            panel(
                "Orchestrator groups",
                "Groups being generated, and finished groups waiting to join a batch.",
                "short",
                [
                    (f"max by (run) (rlrun_orchestrator_inflight_groups{S})", "{{run}} generating"),
                    (f"max by (run) (rlrun_orchestrator_queue_depth_groups{S})", "{{run}} waiting"),
                ],
            ),
            panel(
                "Process memory by component",
                "Resident memory of each service's process.",
                "bytes",
                [
                    (
                        f"sum by (run, component) (process_resident_memory_bytes{S})",
                        "{{run}} {{component}}",
                    )
                ],
            ),
            panel(
                "Process CPU by component",
                "CPU time per second of each service's process (1 = one core).",
                "percentunit",
                [(rate("process_cpu_seconds_total", "run, component"), "{{run}} {{component}}")],
            ),
        ],
    )


DASHBOARDS = {"run-overview.json": run_overview, "services.json": services}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


if __name__ == "__main__":
    for name, text in render().items():
        (HERE / name).write_text(text)
