"""`kubectl apply -f configs/k8s/rlrun.yaml` trains: the README's cluster path, end to end.

A cluster of its own (tests/support/kubecluster): the real control plane, kwok's GPU nodes and
the node agent's CPU node, whose pods run as local processes. The chart is installed with helm,
so the operator itself runs as a pod on the agent's node, with in-cluster credentials; the
sample is applied as the file is, and the operator's pods (`rlrun serve ...` from the images'
entrypoints, the rendered config from its ConfigMap, the run's Secret) find each other through
their headless Services and train. `kubectl get rlrun` shows the step and the reward rising,
and a real Prometheus, configured from the chart's own PodMonitor the way the Prometheus
Operator turns one into a scrape config, scrapes the run's pods."""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from kubecluster import Cluster, ClusterOptions
from kubecluster.kwok import GPU_POOL
from kubecluster.processes import tool

from ..chart.monitoring import MONITORING_VALUES, render
from ..chart.test_monitoring import free_port, get_json, run_prometheus
from .conftest import SAMPLE_PATH

RUN = "reverse-text"
STEPS_METRIC = "rlrun_orchestrator_rl_steps"


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(ClusterOptions(pools=(GPU_POOL,), agent=True, kueue=False)).start()
    try:
        cluster.install_chart()
        yield cluster
    finally:
        cluster.stop()


def run_status(cluster: Cluster) -> dict:
    return cluster.get_json("rlrun", RUN, "-n", "default").get("status") or {}


def pod_monitor_scrape_config(kubeconfig: Path) -> dict:
    """The chart's run PodMonitor as the Prometheus Operator renders it into a scrape job: pod
    discovery, keep the selector's labels and the named port, then the PodMonitor's own
    relabelings, with the namespace label the Operator adds."""
    (monitor,) = [
        o
        for o in render(MONITORING_VALUES)
        if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("-runs")
    ]
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    relabel = [
        {
            "source_labels": [
                f"__meta_kubernetes_pod_label_{key.replace('.', '_').replace('/', '_').replace('-', '_')}"
            ],
            "regex": value,
            "action": "keep",
        }
        for key, value in spec["selector"]["matchLabels"].items()
    ]
    relabel.append(
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
            "action": "keep",
        }
    )
    relabel.append({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"})
    for item in endpoint["relabelings"]:
        rule = {"action": item.get("action", "replace")}
        if "sourceLabels" in item:
            rule["source_labels"] = item["sourceLabels"]
        for key, target in (("separator", "separator"), ("regex", "regex"), ("targetLabel", "target_label")):
            if key in item:
                rule[target] = item[key]
        relabel.append(rule)
    return {
        "job_name": "rlrun-runs",
        "scrape_interval": "2s",
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
        "relabel_configs": relabel,
    }


def test_kubectl_apply_of_the_sample_trains_through_the_operators_pods(cluster, tmp_path):
    operator = cluster.get_json("pods", "-n", "rlrun-system")["items"]
    assert [p["spec"]["nodeName"] for p in operator] == ["agent-0"]  # the operator is a pod too

    cluster.kubectl("apply", "-f", str(SAMPLE_PATH))

    # The run's pods land on the agent's node and get the pod network's addresses.
    deadline = time.monotonic() + 180
    while True:
        pods = cluster.get_json("pods", "-n", "default", "-l", f"rlrun.dev/run={RUN}")["items"]
        ready = [
            p
            for p in pods
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        if len(pods) == 4 and len(ready) == 4:
            break
        assert time.monotonic() < deadline, json.dumps([(p["metadata"]["name"], p["status"]) for p in pods])[
            :4000
        ]
        time.sleep(2)
    assert {p["spec"]["nodeName"] for p in pods} == {"agent-0"}
    addresses = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["status"]["podIP"] for p in pods}
    assert all(ip.startswith("10.244.") for ip in addresses.values()), addresses

    # A real Prometheus, discovering pods through the API server, scrapes the run's pods.
    prometheus = tool("prometheus")  # built with its Kubernetes discovery (Debian's has none)
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump({"scrape_configs": [pod_monitor_scrape_config(cluster.kubeconfig)]})
    )
    web = f"127.0.0.1:{free_port()}"
    with run_prometheus(prometheus, tmp_path, web):
        deadline = time.monotonic() + 120
        while True:
            targets = get_json(f"http://{web}/api/v1/targets")["data"]["activeTargets"]
            up = {t["labels"]["component"]: t for t in targets if t["health"] == "up"}
            if set(up) == {"inference", "env-server", "orchestrator", "trainer"}:
                break
            assert time.monotonic() < deadline, [
                (t["labels"], t["health"], t.get("lastError")) for t in targets
            ]
            time.sleep(2)
        for component, target in up.items():
            assert urllib.parse.urlparse(target["scrapeUrl"]).hostname == addresses[component]
            assert target["labels"]["run"] == RUN and target["labels"]["namespace"] == "default"

        # `kubectl get rlrun` follows the run: the step rises, and so does the reward.
        # (and Prometheus sees the orchestrator's own step counter while the pods are there).
        seen: list[tuple[int, float, float | None]] = []
        scraped_steps = 0.0
        query = urllib.parse.urlencode({"query": f'{STEPS_METRIC}{{run="{RUN}",component="orchestrator"}}'})
        deadline = time.monotonic() + 600
        while True:
            status = run_status(cluster)
            if status.get("phase") == "Running" and status.get("step") is not None:
                entry = (status["step"], status.get("reward") or 0.0, status.get("evalReward"))
                if not seen or entry != seen[-1]:
                    seen.append(entry)
                if status["step"] >= 10 and not scraped_steps:
                    result = get_json(f"http://{web}/api/v1/query?{query}")["data"]["result"]
                    scraped_steps = float(result[0]["value"][1]) if result else 0.0
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            assert time.monotonic() < deadline, seen[-5:]
            time.sleep(2)
        assert status["phase"] == "Succeeded", status
        assert scraped_steps > 0

    steps = [step for step, _, _ in seen]
    assert steps == sorted(steps) and steps[-1] >= 90, steps
    printed = cluster.kubectl("get", "rlrun", RUN, "-n", "default", "--no-headers").stdout.split()
    assert printed[:3] == [RUN, "Succeeded", "100"], printed
    evals = [value for _, _, value in seen if value is not None]
    assert len(evals) >= 3 and evals[-1] > evals[0] + 0.2, seen
    early, late = seen[: len(seen) // 4], seen[-len(seen) // 4 :]
    assert sum(r for _, r, _ in late) / len(late) > sum(r for _, r, _ in early) / len(early), seen
