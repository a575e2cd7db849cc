"""The Helm chart, offline through helm-python-sdk (no helm binary): it lints and renders with
the default values and every ci/*-values.yaml, the rendered objects are valid Kubernetes objects,
the values schema rejects bad values, RBAC is least privilege, and the alerts and dashboards
use the services' metric names. Alert rules and dashboard queries are also checked by promtool
when it is installed (`apt-get install prometheus`); those tests skip without it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate.utils
import pytest
import yaml

helm = pytest.importorskip("helm_python")

from rlrun.cli import build_parser  # noqa: E402
from rlrun.operator.rbac import REQUIRED_RULES, SECRET_RULES, permission_set  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlrun"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = [("default", None)] + [(p.name, yaml.safe_load(p.read_text())) for p in CI_VALUES]
K8S_VERSION = "1.30.0"
PROMETHEUS_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
METRIC = re.compile(r"\b(rlrun_[a-z0-9_]+)\b")
KNOWN_METRICS = {
    "rlrun_orchestrator_step",
    "rlrun_orchestrator_reward_mean",
    "rlrun_orchestrator_off_policy_steps",
    "rlrun_orchestrator_max_off_policy_steps",
    "rlrun_orchestrator_groups_dropped_stale_total",
    "rlrun_orchestrator_rollout_errors_total",
    "rlrun_orchestrator_rollouts_total",
    "rlrun_inference_generated_tokens_total",
    "rlrun_trainer_step_seconds",
    "rlrun_trainer_tokens_per_second",
    "rlrun_trainer_weight_broadcast_seconds",
}
HISTOGRAMS = {
    "rlrun_orchestrator_off_policy_steps",
    "rlrun_trainer_step_seconds",
    "rlrun_trainer_weight_broadcast_seconds",
}


def render(values: dict | None) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="rlrun", namespace="rlrun-system", is_install=True)
    objects = []
    for name, text in sorted(rendered.items()):
        if name.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def base_metric(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in HISTOGRAMS:
            return name.removesuffix(suffix)
    return name


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_chart_lints_strictly(label, values):
    report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
    assert not report["errors"], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_rendered_objects_are_valid(label, values):
    objects = render(values)
    assert by_kind(objects, "Deployment")
    for obj in objects:
        if obj["kind"] in PROMETHEUS_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["spec"], obj["kind"]
            continue
        kubernetes_validate.utils.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rlrun"


def test_ci_values_cover_the_optional_templates():
    kinds = {o["kind"] for _, values in VALUE_SETS for o in render(values)}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "ClusterRole", "Role"} <= kinds


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_operator_pod_is_restricted_and_speaks_the_cli(label, values):
    (deployment,) = by_kind(render(values), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    # The args are what `rlrun operator` accepts (the image's entrypoint is `rlrun operator`).
    args = build_parser().parse_args(["operator", *container["args"]])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    (port,) = container["ports"]
    assert port["containerPort"] == args.liveness_port
    env = {e["name"]: e["value"] for e in container["env"]}
    merged = helm.Chart.load(CHART).merge_values(values)
    assert env["RLRUN_IMAGE_INFERENCE"] == merged["runImages"]["inference"]
    assert float(env["RLRUN_STATUS_INTERVAL"]) == merged["operator"]["statusInterval"]
    if merged["operator"]["watchAllNamespaces"]:
        assert args.all_namespaces and not args.namespace
    else:
        assert args.namespace == merged["operator"]["watchNamespaces"]
    if merged["image"]["digest"]:
        assert container["image"] == f"{merged['image']['repository']}@{merged['image']['digest']}"


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_rbac_is_exactly_what_the_operator_uses_without_wildcards(label, values):
    objects = render(values)
    merged = helm.Chart.load(CHART).merge_values(values)
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    assert roles
    expected = permission_set(REQUIRED_RULES + (SECRET_RULES if merged["rbac"]["readSecrets"] else []))
    for role in roles:
        granted = set()
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            granted |= {
                (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
            }
        assert granted == expected
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert len(bindings) == len(roles)
    if merged["operator"]["watchAllNamespaces"]:
        assert [r["kind"] for r in roles] == ["ClusterRole"]
    else:
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(
            merged["operator"]["watchNamespaces"]
        )


BAD_VALUES = [
    {"image": {"tag": 5}},
    {"image": {"digest": "latest"}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"operator": {"watchAllNamespaces": False, "watchNamespaces": []}},
    {"operator": {"watchNamespaces": ["Not_A_Namespace"]}},
    {"operator": {"statusInterval": 0}},
    {"operator": {"livenessPort": 80}},
    {"runImages": {"inference": ""}},
    {"monitoring": {"prometheusRule": {"envErrorRatio": 1.5}}},
    {"monitoring": {"prometheusRule": {"stallMinutes": 0}}},
    {"monitoring": {"serviceMonitor": {"interval": "often"}}},
    {"monitoring": {"dashboards": {"enabled": "yes"}}},
    {"rbac": {"create": True, "wildcards": True}},
    {"replicaCount": 3},
]


@pytest.mark.parametrize("values", BAD_VALUES, ids=[json.dumps(v) for v in BAD_VALUES])
def test_values_schema_rejects_bad_values(values):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(values)
        with pytest.raises(helm.HelmValuesError):
            chart.render(values, name="rlrun", namespace="rlrun-system")
    report = helm.lint(CHART, values)
    assert report["errors"], f"lint accepted {values}"


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_values_schema_accepts_the_shipped_values(label, values):
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        assert chart.schema["additionalProperties"] is False


def test_the_chart_ships_the_generated_crd():
    from rlrun.operator.crd import crd

    with helm.Chart.load(CHART) as chart:
        (entry,) = chart.crds
    assert yaml.safe_load(entry["data"]) == crd()


def test_plain_install_manifest_is_valid_and_complete():
    objects = [doc for doc in yaml.safe_load_all((REPO / "operator" / "install.yaml").read_text()) if doc]
    kinds = [o["kind"] for o in objects]
    assert kinds[:2] == ["Namespace", "CustomResourceDefinition"]
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= set(kinds)
    for obj in objects:
        kubernetes_validate.utils.validate(obj, K8S_VERSION, strict=True)
    rbac = [doc for doc in yaml.safe_load_all((REPO / "operator" / "rbac.yaml").read_text()) if doc]
    assert [o["kind"] for o in rbac] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]


# --- dashboards and alerts --------------------------------------------------------------------


def monitoring_objects() -> list[dict]:
    return render(yaml.safe_load((CHART / "ci" / "monitoring-values.yaml").read_text()))


def dashboards() -> dict[str, dict]:
    out = {}
    for cm in by_kind(monitoring_objects(), "ConfigMap"):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        for name, text in cm["data"].items():
            out[name] = json.loads(text)
    return out


def queries(dashboard: dict) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def alert_rules(values: dict | None = None) -> list[dict]:
    objects = render(values) if values is not None else monitoring_objects()
    (rule,) = by_kind(objects, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_dashboards_are_labelled_configmaps_and_cover_the_run_overview():
    boards = dashboards()
    assert set(boards) == {"run-overview.json", "services.json"}
    overview = boards["run-overview.json"]
    titles = {p["title"] for p in overview["panels"]}
    assert {
        "Reward",
        "Trainer step time",
        "Off-policy staleness",
        "Tokens per second",
        "Env errors",
        "Weight broadcast time",
    } <= titles
    used = {base_metric(m) for expr in queries(overview) for m in METRIC.findall(expr)}
    assert {
        "rlrun_orchestrator_reward_mean",
        "rlrun_trainer_step_seconds",
        "rlrun_orchestrator_off_policy_steps",
        "rlrun_inference_generated_tokens_total",
        "rlrun_orchestrator_rollout_errors_total",
        "rlrun_trainer_weight_broadcast_seconds",
    } <= used
    assert {v["name"] for v in overview["templating"]["list"]} == {"datasource", "namespace", "run"}
    ids = [p["id"] for p in overview["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboards_and_alerts_use_only_the_services_metric_names():
    exprs = [e for board in dashboards().values() for e in queries(board)] + [
        r["expr"] for r in alert_rules()
    ]
    used = {base_metric(m) for expr in exprs for m in METRIC.findall(expr)}
    assert used <= KNOWN_METRICS, used - KNOWN_METRICS
    for name in used:
        assert re.fullmatch(r"rlrun_(orchestrator|inference|trainer|env_server)_[a-z0-9_]+", name)


def test_alert_rules():
    rules = {r["alert"]: r for r in alert_rules()}
    assert set(rules) == {
        "RLRunStepStalled",
        "RLRunStalenessAtBound",
        "RLRunGroupsDroppedStale",
        "RLRunEnvErrorRateHigh",
    }
    assert "[20m]" in rules["RLRunStepStalled"]["expr"]  # stallMinutes from ci/monitoring-values.yaml
    default = {r["alert"]: r for r in alert_rules({"monitoring": {"prometheusRule": {"enabled": True}}})}
    assert "changes(rlrun_orchestrator_step[15m])" in default["RLRunStepStalled"]["expr"]
    assert "rlrun_orchestrator_max_off_policy_steps" in default["RLRunStalenessAtBound"]["expr"]
    assert "> 0.1" in default["RLRunEnvErrorRateHigh"]["expr"]
    for rule in rules.values():
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert "{{ $labels.run }}" in rule["annotations"]["summary"]


# --- promtool (optional) ----------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules_and_the_dashboard_queries(tmp_path):
    (rule,) = by_kind(monitoring_objects(), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # Dashboard queries parse as PromQL once Grafana's variables are substituted.
    records = []
    for board in dashboards().values():
        for i, expr in enumerate(queries(board)):
            expr = expr.replace("$__rate_interval", "5m").replace("$namespace", "ns").replace("$run", ".*")
            records.append({"record": f"rlrun:dashboard_query_{len(records)}_{i}", "expr": expr})
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": records}]})
    )
    result = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


PROMTOOL_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # run a: 10 steps, then stuck; run b: keeps stepping.
      - series: 'rlrun_orchestrator_step{namespace="ns", run="a"}'
        values: '0+1x10 10x40'
      - series: 'rlrun_orchestrator_step{namespace="ns", run="b"}'
        values: '0+1x50'
      # run a sits at its bound (mean staleness 1, bound 1); run b does not (bound 2).
      - series: 'rlrun_orchestrator_off_policy_steps_sum{namespace="ns", run="a"}'
        values: '0+4x50'
      - series: 'rlrun_orchestrator_off_policy_steps_count{namespace="ns", run="a"}'
        values: '0+4x50'
      - series: 'rlrun_orchestrator_max_off_policy_steps{namespace="ns", run="a"}'
        values: '1x50'
      - series: 'rlrun_orchestrator_off_policy_steps_sum{namespace="ns", run="b"}'
        values: '0+4x50'
      - series: 'rlrun_orchestrator_off_policy_steps_count{namespace="ns", run="b"}'
        values: '0+4x50'
      - series: 'rlrun_orchestrator_max_off_policy_steps{namespace="ns", run="b"}'
        values: '2x50'
      # env "flaky" fails 20% of its rollouts, env "fine" 2%.
      - series: 'rlrun_orchestrator_rollouts_total{namespace="ns", run="a", env="flaky"}'
        values: '0+50x50'
      - series: 'rlrun_orchestrator_rollout_errors_total{namespace="ns", run="a", env="flaky"}'
        values: '0+10x50'
      - series: 'rlrun_orchestrator_rollouts_total{namespace="ns", run="a", env="fine"}'
        values: '0+50x50'
      - series: 'rlrun_orchestrator_rollout_errors_total{namespace="ns", run="a", env="fine"}'
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
            exp_annotations: {summary: "RLRun ns/a trains at its staleness bound"}
      - eval_time: 40m
        alertname: RLRunEnvErrorRateHigh
        exp_alerts:
          - exp_labels: {severity: warning, namespace: ns, run: a, env: flaky}
            exp_annotations: {summary: "RLRun ns/a: more than 0.1 of the rollouts of env flaky fail"}
      - eval_time: 40m
        alertname: RLRunGroupsDroppedStale
        exp_alerts: []
"""


@needs_promtool
def test_promtool_unit_tests_of_the_alerts(tmp_path):
    (rule,) = by_kind(render({"monitoring": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            del alert["annotations"]["description"]  # the summaries are checked, templated
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "tests.yaml").write_text(PROMTOOL_TESTS)
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
