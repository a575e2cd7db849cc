"""`rlrun operator` as a real process: kubeconfig login, the default API client, the liveness
endpoint, a reconcile against the real API server as the chart's ServiceAccount, its /metrics
scraped by a real Prometheus, then a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import load_sample

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
        return response.status


async def test_rlrun_operator_process(namespace, kube, operator_kubeconfig, tmp_path, eventually):
    """The operator as its pod runs it: a kubeconfig with the chart's ServiceAccount token."""
    rlrun = Path(sys.executable).with_name("rlrun")
    if not rlrun.exists():
        pytest.fail(f"no rlrun console script at {rlrun}: run `make setup` (pip install -e installs it)")
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(operator_kubeconfig),
        "RLRUN_STATUS_INTERVAL": "0.5",
        "RLRUN_IMAGE_TRAINER": "example.com/t:1",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    process = await asyncio.create_subprocess_exec(
        str(rlrun),
        "operator",
        "--namespace",
        namespace,
        f"--liveness-port={port}",
        f"--metrics-port={metrics_port}",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await eventually(lambda: healthz(port) == 200, timeout=30, message="liveness endpoint answers")
        await asyncio.to_thread(kube.create, load_sample(namespace=namespace))
        trainer = await eventually(
            lambda: kube.get("apps/v1", "StatefulSet", namespace, "reverse-text-trainer"),
            timeout=20,
            message="trainer",
        )
        assert trainer["spec"]["template"]["spec"]["containers"][0]["image"] == "example.com/t:1"
        run = await eventually(
            lambda: (
                (r := kube.get("rlrun.dev/v1alpha1", "RLRun", namespace, "reverse-text"))
                and r.get("status", {}).get("phase") == "Pending"
                and r
            ),
            timeout=20,
            message="status written",
        )
        degraded = {c["type"]: c for c in run["status"]["conditions"]}
        assert degraded["ConfigValid"]["status"] == "True"
        scraped = await asyncio.to_thread(scrape_with_prometheus, metrics_port, tmp_path, namespace)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
        except TimeoutError:
            process.kill()
            output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()[-3000:]
    # What a real Prometheus scraped of the operator: the run's phase, and reconcile passes of
    # both handlers (create, then the status timer), timed, without errors.
    assert scraped['rlrun_operator_run_phase{phase="Pending"}'] == 1
    assert scraped['rlrun_operator_run_phase{phase="Running"}'] == 0
    assert scraped['rlrun_operator_reconciles_total{handler="reconcile"}'] >= 1
    assert scraped['rlrun_operator_reconciles_total{handler="status"}'] >= 1
    assert scraped['rlrun_operator_reconcile_duration_seconds_count{handler="status"}'] >= 1
    assert scraped["rlrun_operator_reconcile_errors_total"] == 0


PROMQL = {
    'rlrun_operator_run_phase{phase="Pending"}': 'rlrun_operator_run_phase{run="reverse-text",namespace="NS",phase="Pending"}',
    'rlrun_operator_run_phase{phase="Running"}': 'rlrun_operator_run_phase{run="reverse-text",namespace="NS",phase="Running"}',
    'rlrun_operator_reconciles_total{handler="reconcile"}': 'rlrun_operator_reconciles_total{handler="reconcile"}',
    'rlrun_operator_reconciles_total{handler="status"}': 'rlrun_operator_reconciles_total{handler="status"}',
    'rlrun_operator_reconcile_duration_seconds_count{handler="status"}': 'rlrun_operator_reconcile_duration_seconds_count{handler="status"}',
    "rlrun_operator_reconcile_errors_total": "sum(rlrun_operator_reconcile_errors_total)",
}


def scrape_with_prometheus(port: int, folder: Path, namespace: str) -> dict[str, float]:
    """Runs a real Prometheus scraping the operator's /metrics every second; once every query
    of PROMQL (for the run in `namespace`) answers, returns their values."""
    import time
    import urllib.parse

    from ..chart.monitoring import prometheus_binaries
    from ..chart.test_monitoring import get_json, run_prometheus

    _, prometheus = prometheus_binaries()
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "operator", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = f"127.0.0.1:{free_port()}"
    with run_prometheus(prometheus, folder, web):
        deadline = time.monotonic() + 30
        while True:
            values = {}
            for key, query in PROMQL.items():
                query = query.replace('namespace="NS"', f'namespace="{namespace}"')
                url = f"http://{web}/api/v1/query?" + urllib.parse.urlencode({"query": query})
                result = get_json(url)["data"]["result"]
                if result:
                    values[key] = float(result[0]["value"][1])
            if len(values) == len(PROMQL) and values[next(iter(PROMQL))] == 1 or time.monotonic() > deadline:
                return values
            time.sleep(0.5)
