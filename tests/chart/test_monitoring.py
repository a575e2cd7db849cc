"""The chart's monitoring objects: the dashboards (as code, in step with generate.py, each
panel's unit fitting what its PromQL computes, each legend naming what it groups by, valid for
Grafana's own dashboard schema), the alert rules (promtool checks them and unit-tests that each
fires on the series the services export and stays silent when healthy), and the
ServiceMonitor/PodMonitor relabelling (a real Prometheus applies it). Whether the services
export every name used here: tests/integration/observability."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from promql_parser import MatchOp

from .monitoring import (
    CHART,
    MONITORING_VALUES,
    REPO,
    UNITS,
    dashboards,
    dimension,
    grafana_to_promql,
    grouping,
    legend_labels,
    metric_names,
    prometheus_binaries,
    queries,
    render,
    rule_spec,
    selectors,
)

importlib.import_module("helm_python")

NODE_DIR = REPO / ".venv" / "node"  # `make setup` installs @grafana/schema and typescript here


def generator():
    spec = importlib.util.spec_from_file_location("generate", CHART / "dashboards" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboards_are_what_their_code_generates():
    for name, text in generator().render().items():
        assert (CHART / "dashboards" / name).read_text() == text, (
            f"{name} is out of step: run python charts/rlrun/dashboards/generate.py"
        )


def test_dashboards_ship_as_labelled_configmaps_where_grafana_looks():
    values = yaml.safe_load((CHART / "ci" / "monitoring-values.yaml").read_text())
    maps = [
        o
        for o in render(values)
        if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert sorted(n for cm in maps for n in cm["data"]) == sorted(generator().DASHBOARDS)
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == values["monitoring"]["dashboards"]["namespace"]


def test_each_panel_has_a_unit_that_fits_its_queries_and_legends_that_tell_series_apart():
    panels = [q for q in queries() if q.panel]
    assert panels
    for q in panels:
        assert q.unit in UNITS[dimension(q.expr)], (q.where, q.unit, dimension(q.expr))
        grouped = grouping(q.expr)
        assert "run" in grouped, q.where  # several runs share a dashboard
        assert legend_labels(q.legend) == grouped, (q.where, q.legend, grouped)
    for name, board in dashboards().items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        cells = set()
        for p in board["panels"]:
            g = p["gridPos"]
            area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & area, (name, p["title"], "overlaps another panel")
            cells |= area
            assert p["description"], (name, p["title"])


def test_every_query_filters_on_the_namespace_and_run_variables():
    for q in queries(rules=[]):
        if not q.panel:
            continue
        for selector in selectors(q.expr):
            matchers = [(m.name, m.op, m.value) for m in selector.matchers.matchers]
            assert ("namespace", MatchOp.Equal, "ns") in matchers and ("run", MatchOp.Re, ".*") in matchers, (
                q.where,
                matchers,
            )


def test_the_run_overview_has_the_panels_the_issue_asks_for():
    """Weight broadcast time, staleness drops and rollout errors per env: each has a panel
    reading that family, and those per env group by env."""
    read = {}
    for q in queries(rules=[]):
        if q.panel and q.where.startswith("run-overview.json"):
            for name in metric_names(q.expr):
                read.setdefault(name, set()).add(tuple(sorted(grouping(q.expr))))
    assert any(n.startswith("rlrun_trainer_weight_broadcast_seconds") for n in read)
    assert ("env", "run") in read["rlrun_orchestrator_groups_dropped_stale_total"]
    assert ("env", "run") in read["rlrun_env_server_failed_rollouts_total"]


def test_dashboards_validate_against_grafanas_dashboard_schema(tmp_path):
    """Type-checked by TypeScript against @grafana/schema (Grafana's generated types of its
    dashboard schema): the Dashboard, and each timeseries panel's options and field config
    against the timeseries panel's own. Object literals get excess-property checks, so an
    unknown or misspelt field fails, as does a wrong type or a missing required field."""
    tsc = NODE_DIR / "node_modules" / ".bin" / "tsc"
    assert tsc.exists() and shutil.which("node"), (
        "run `make setup` (npm installs @grafana/schema, typescript)"
    )
    lines = [
        "import type { Dashboard } from '@grafana/schema';",
        # JSON carries an enum's value, which TypeScript's string enums only take by name.
        "type Json<T> = T extends string ? `${T}` : T extends object ? { [K in keyof T]: Json<T[K]> } : T;",
        "import type { Options, FieldConfig } from "
        "'@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';",
    ]
    for i, (name, board) in enumerate(sorted(dashboards().items())):
        lines.append(f"// {name}\nexport const dashboard{i}: Json<Dashboard> = {json.dumps(board)};")
        for j, panel in enumerate(board["panels"]):
            assert panel["type"] == "timeseries", (name, panel["title"])
            lines.append(f"export const options{i}_{j}: Json<Options> = {json.dumps(panel['options'])};")
            custom = panel["fieldConfig"]["defaults"].get("custom", {})
            lines.append(f"export const custom{i}_{j}: Json<FieldConfig> = {json.dumps(custom)};")
    (tmp_path / "dashboards.ts").write_text("\n".join(lines) + "\n")
    (tmp_path / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "strict": True,
                    "noEmit": True,
                    "module": "nodenext",
                    "moduleResolution": "nodenext",
                    "target": "es2022",
                    "skipLibCheck": True,
                    "typeRoots": [],
                    "baseUrl": str(NODE_DIR / "node_modules"),
                    "paths": {"*": [str(NODE_DIR / "node_modules" / "*")]},
                },
                "files": ["dashboards.ts"],
            }
        )
    )
    (tmp_path / "node_modules").symlink_to(NODE_DIR / "node_modules")
    result = subprocess.run([str(tsc), "-p", "."], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


# --- promtool ---------------------------------------------------------------------------------


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [prometheus_binaries()[0], *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_the_rules_and_the_dashboard_queries(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [
        {"record": f"rlrun:dashboard_query_{i}", "expr": grafana_to_promql(q.expr)}
        for i, q in enumerate(queries(rules=[]))
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": records}]})
    )
    result = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# Each alert fires for the broken run and stays silent for the healthy ones. The series are
# the ones the services export, with their labels (env, split, stop_condition; namespace and
# run from the ServiceMonitor or prometheus_targets.json); the test checks it feeds exactly
# the names the rules read.
PROMTOOL_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # run a: 10 steps, then stuck; run b: keeps stepping; run c: started 5 minutes ago, still
      # loading (no step yet, but too young to call stalled).
      - series: 'rlrun_orchestrator_policy_version{namespace="ns", run="a", component="orchestrator"}'
        values: '0+1x10 10x40'
      - series: 'rlrun_orchestrator_policy_version{namespace="ns", run="b", component="orchestrator"}'
        values: '0+1x50'
      - series: 'rlrun_orchestrator_policy_version{namespace="ns", run="c", component="orchestrator"}'
        values: '_x35 0x15'
      # run a trains 4 groups a minute and drops 2 as stale (a third); run b trains 8, drops
      # one every 2 minutes (6%).
      - series: 'rlrun_orchestrator_off_policy_steps_count{namespace="ns", run="a"}'
        values: '0+4x50'
      - series: 'rlrun_orchestrator_groups_dropped_stale_total{namespace="ns", run="a", env="reverse-text"}'
        values: '0+2x50'
      - series: 'rlrun_orchestrator_off_policy_steps_count{namespace="ns", run="b"}'
        values: '0+8x50'
      - series: 'rlrun_orchestrator_groups_dropped_stale_total{namespace="ns", run="b", env="reverse-text"}'
        values: '0 0 1 1 2 2 3 3 4 4 5 5 6 6 7 7 8 8 9 9 10 10 11 11 12 12 13 13 14 14 15 15 16 16 17 17 18 18 19 19 20 20 21 21 22 22 23 23 24 24 25'
      # run c drops none.
      - series: 'rlrun_orchestrator_groups_dropped_stale_total{namespace="ns", run="c", env="reverse-text"}'
        values: '0x50'
      # env "flaky" of run a fails 20% of its rollouts, env "fine" 2% (its series at 0 from the
      # start, as the env-server creates it).
      - series: 'rlrun_env_server_rollouts_total{namespace="ns", run="a", env="flaky", split="train", stop_condition="completed"}'
        values: '0+40x50'
      - series: 'rlrun_env_server_rollouts_total{namespace="ns", run="a", env="flaky", split="train", stop_condition="error"}'
        values: '0+10x50'
      - series: 'rlrun_env_server_failed_rollouts_total{namespace="ns", run="a", env="flaky"}'
        values: '0+10x50'
      - series: 'rlrun_env_server_rollouts_total{namespace="ns", run="a", env="fine", split="train", stop_condition="completed"}'
        values: '0+50x50'
      - series: 'rlrun_env_server_failed_rollouts_total{namespace="ns", run="a", env="fine"}'
        values: '0+1x50'
    alert_rule_test:
      - eval_time: 20m
        alertname: RLRunStepStalled
        exp_alerts: []
      - eval_time: 40m
        alertname: RLRunStepStalled
        exp_alerts:
          - exp_labels: {severity: critical, namespace: ns, run: a}
            exp_annotations: {summary: "RLRun ns/a made no step progress for 15 minutes"}
      - eval_time: 40m
        alertname: RLRunStalenessAtBound
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, run: a}
            exp_annotations: {summary: "RLRun ns/a trains at its staleness bound and drops many groups"}
      - eval_time: 40m
        alertname: RLRunGroupsDroppedStale
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, run: a}
            exp_annotations: {summary: "RLRun ns/a keeps dropping groups older than its staleness bound"}
          - exp_labels: {severity: warning, namespace: ns, run: b}
            exp_annotations: {summary: "RLRun ns/b keeps dropping groups older than its staleness bound"}
      - eval_time: 40m
        alertname: RLRunEnvErrorRateHigh
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, run: a, env: flaky}
            exp_annotations: {summary: "RLRun ns/a: more than 0.1 of the rollouts of env flaky fail"}
"""


def test_promtool_unit_tests_make_each_alert_fire_and_stay_silent_when_healthy(tmp_path):
    spec = rule_spec()
    for group in spec["groups"]:
        for alert in group["rules"]:
            del alert["annotations"]["description"]  # the summaries are checked, templated
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "tests.yaml").write_text(PROMTOOL_TESTS)
    tests = yaml.safe_load(PROMTOOL_TESTS)["tests"][0]
    fed = {s["series"].split("{")[0] for s in tests["input_series"]}
    read = {n for group in spec["groups"] for r in group["rules"] for n in metric_names(r["expr"])}
    assert fed == read, fed ^ read
    assert {t["alertname"] for t in tests["alert_rule_test"] if t["exp_alerts"]} == {
        r["alert"] for group in spec["groups"] for r in group["rules"]
    }
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- ServiceMonitor / PodMonitor relabelling, applied by a real Prometheus --------------------


def relabel_configs(relabelings: list[dict]) -> list[dict]:
    """The Prometheus Operator's translation of a monitor's relabelings (camelCase to
    snake_case), after its own `namespace` relabelling (which it always adds)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    out = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}]
    return out + [{keys.get(k, k): v for k, v in r.items()} for r in relabelings]


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_scrape_trainer_rank_0_only_and_label_like_rlrun_local(tmp_path, kind):
    """Kubernetes discovery's meta labels of a run's pods, given to a real Prometheus through
    file_sd with the monitor's relabelling: the trainer's pod 1 (a rank that serves no
    /metrics) is no target, every other pod is, labelled run/component/instance/namespace."""
    from prometheus_client import CollectorRegistry, Gauge

    from rlrun.common.metrics import start_metrics_server, stop_metrics_server

    _, prometheus = prometheus_binaries()
    (monitor,) = [
        o for o in render(MONITORING_VALUES) if o["kind"] == kind and o["metadata"]["name"].endswith("-runs")
    ]
    endpoint = (monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"])[0]
    meta = "service" if kind == "ServiceMonitor" else "pod"
    registry = CollectorRegistry()
    Gauge("rlrun_test_up", "a live target", registry=registry).set(1)
    port = start_metrics_server(0, registry=registry)
    try:
        pods = [("trainer", "r1-trainer-0"), ("trainer", "r1-trainer-1"), ("inference", "r1-inference-1")]
        targets = [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {
                    "__meta_kubernetes_namespace": "team-a",
                    f"__meta_kubernetes_{meta}_label_app_kubernetes_io_instance": "r1",
                    f"__meta_kubernetes_{meta}_label_app_kubernetes_io_component": component,
                    "__meta_kubernetes_pod_name": pod,
                    "__param_pod": pod,  # keeps the three targets apart (same address)
                },
            }
            for component, pod in pods
        ]
        (tmp_path / "targets.json").write_text(json.dumps(targets))
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "monitor",
                    "file_sd_configs": [{"files": [str(tmp_path / "targets.json")]}],
                    "relabel_configs": relabel_configs(endpoint["relabelings"]),
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = f"127.0.0.1:{free_port()}"
        with run_prometheus(prometheus, tmp_path, web):
            deadline = time.monotonic() + 30
            while True:
                active = get_json(f"http://{web}/api/v1/targets")["data"]["activeTargets"]
                if (
                    len(active) >= 2
                    and all(t["health"] == "up" for t in active)
                    or time.monotonic() > deadline
                ):
                    break
                time.sleep(0.5)
    finally:
        stop_metrics_server(port)
    labels = sorted((t["labels"]["component"], t["labels"]["instance"]) for t in active)
    assert labels == [("inference", "r1-inference-1"), ("trainer", "r1-trainer-0")]
    for target in active:
        assert target["health"] == "up", target
        assert target["labels"]["run"] == "r1" and target["labels"]["namespace"] == "team-a"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class run_prometheus:  # noqa: N801 - a context manager
    """A real Prometheus on 127.0.0.1 with its data in `folder`, until the block ends."""

    def __init__(self, binary: str, folder: Path, web: str, config: str = "prometheus.yml"):
        self.args = [
            binary,
            f"--config.file={folder / config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address={web}",
            "--web.enable-lifecycle",
        ]
        self.web, self.log = web, folder / "prometheus.log"

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.web}/-/ready", timeout=2)
                return self
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
                time.sleep(0.2)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_either_monitor_scrapes_the_operator_metrics_port():
    objects = render(MONITORING_VALUES)
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = operator["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--metrics-port={ports['metrics']}" in container["args"]

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector.items())

    (pod_monitor,) = [
        o for o in objects if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("-operator")
    ]
    assert selects(pod_monitor["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert [e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    (service_monitor,) = [
        o for o in objects if o["kind"] == "ServiceMonitor" and o["metadata"]["name"].endswith("-operator")
    ]
    (service,) = [
        o
        for o in objects
        if o["kind"] == "Service"
        and selects(service_monitor["spec"]["selector"]["matchLabels"], o["metadata"]["labels"])
    ]
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    assert [(p["name"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", "metrics")]
    assert [e["port"] for e in service_monitor["spec"]["endpoints"]] == ["metrics"]
    # The runs' monitors select run objects only, not the operator.
    for kind in ("ServiceMonitor", "PodMonitor"):
        (runs,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith("-runs")]
        assert not selects(runs["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
