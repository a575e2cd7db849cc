"""The Helm chart, offline through helm-python-sdk (no helm binary): it lints and renders with
the default values and every ci/*-values.yaml, the rendered objects are valid Kubernetes objects,
the values schema rejects bad values, RBAC is least privilege. The monitoring objects
(dashboards, alerts, ServiceMonitor/PodMonitor) are checked in test_monitoring.py; whether the
services export what they read, in tests/integration/observability."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import kubernetes_validate.utils
import pytest
import yaml

helm = importlib.import_module("helm_python")

from rlrun.cli import build_parser  # noqa: E402
from rlrun.operator.rbac import REQUIRED_RULES, SECRET_RULES, permission_set  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlrun"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = [("default", None)] + [(p.name, yaml.safe_load(p.read_text())) for p in CI_VALUES]
K8S_VERSIONS = ("1.33.0", "1.37.0")
"""The oldest Kubernetes the objects must suit, and the newest kubernetes-validate knows."""
PROMETHEUS_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


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
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rlrun"


def test_ci_values_cover_the_optional_templates():
    kinds = {o["kind"] for _, values in VALUE_SETS for o in render(values)}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "ClusterRole", "Role"} <= kinds


@pytest.mark.parametrize(("label", "values"), VALUE_SETS, ids=[v[0] for v in VALUE_SETS])
def test_operator_pod_is_restricted_and_speaks_the_cli(label, values):
    objects = render(values)
    (deployment,) = by_kind(objects, "Deployment")
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
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": args.liveness_port, "metrics": args.metrics_port}
    env = {e["name"]: e.get("value") for e in container["env"]}
    merged = helm.Chart.load(CHART).merge_values(values)
    assert container["env"][0]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The token key is mounted from its Secret where the CLI reads it.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert args.token_key_file == f"{mounts['token-key']}/key"
    secret = volumes["token-key"]["secret"]["secretName"]
    generated = [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"]
    assert generated == ([] if merged["tokenKey"]["existingSecret"] else [secret])
    assert args.metrics_namespace == merged["networkPolicy"]["metricsNamespaces"]
    assert (args.grpc_tls_dir is not None) == bool(merged["grpcTls"]["secret"])
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
    expected = permission_set(REQUIRED_RULES)
    secrets = permission_set(SECRET_RULES)
    # The operator reads no Secret: it writes each run's own and derives the credentials.
    assert secrets == {("", "secrets", "create"), ("", "secrets", "patch"), ("", "secrets", "delete")}
    assert not [p for p in expected if p[1] == "secrets"]
    granted_by: dict[tuple[str, str], set] = {}
    for role in roles:
        granted = set()
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (role["metadata"]["name"], rule)
            granted |= {
                (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
            }
        granted_by[(role["kind"], role["metadata"].get("namespace", ""))] = granted
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert len(bindings) == len(roles)
    operator = merged["operator"]
    if operator["watchAllNamespaces"]:
        # Everything cluster-wide but Secrets, which only the run namespaces' Roles grant.
        assert granted_by.pop(("ClusterRole", "")) == expected
        assert granted_by == {("Role", ns): secrets for ns in operator["runNamespaces"]}
    else:
        assert granted_by == {("Role", ns): expected | secrets for ns in operator["watchNamespaces"]}


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
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)
    rbac = [doc for doc in yaml.safe_load_all((REPO / "operator" / "rbac.yaml").read_text()) if doc]
    assert sorted(o["kind"] for o in rbac) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert [o["metadata"].get("namespace") for o in rbac if o["kind"].startswith("Role")] == ["default"] * 2
