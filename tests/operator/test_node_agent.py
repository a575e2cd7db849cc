"""The test cluster's node agent (tests/support/kubecluster/agent) against the real control plane:
pods bound to its Node run as local processes, each in network, mount and PID namespaces of its
own, with the pod's volumes, environment, probes and restart policy, and Service names resolve
through CoreDNS. The pods are Python programs on rlrun's images (which the agent maps to
Dockerfiles/ and the checkout's venv); every check goes through the API server as a user's
would (pod status, kubectl logs), or looks at the host (processes, files it wrote)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubecluster import Cluster, ClusterOptions

IMAGE = "ghcr.io/rlrun/rlrun-orchestrator:test"
PORT = 50051

SERVER = """\
import http.server, os, signal, sys
greeting = open("/etc/greeter/greeting.txt").read().strip()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{greeting} {os.environ['TOKEN']} {os.environ['POD_NAME']} {os.environ['POD_IP']}".encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""

CLIENT = """\
import socket, sys, time, urllib.request
name, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.time() + 60
while True:
    try:
        addresses = sorted({a[4][0] for a in socket.getaddrinfo(name, port, proto=socket.IPPROTO_TCP)})
        if len(addresses) == count:
            break
    except OSError as error:
        print("not resolved yet:", error, flush=True)
    if time.time() > deadline:
        sys.exit(f"{name} did not resolve to {count} addresses")
    time.sleep(0.5)
for address in addresses:
    print(urllib.request.urlopen(f"http://{address}:{port}/", timeout=10).read().decode(), flush=True)
"""

HEALTH_SERVER = """\
import os, signal, sys, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(2))
servicer = health.HealthServicer()
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
server.add_insecure_port("0.0.0.0:50051")
server.start()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
NOT_SERVING, SERVING = health_pb2.HealthCheckResponse.NOT_SERVING, health_pb2.HealthCheckResponse.SERVING
while True:
    ready = open("/etc/switch/ready").read().strip() == "yes"
    servicer.set("", SERVING if ready else NOT_SERVING)
    time.sleep(0.2)
"""

SIGNALS = """\
import os, signal, subprocess, sys, time
out = sys.argv[1]
def stop(*_):
    with open(out, "a") as f:
        f.write(f"SIGTERM pid={os.getpid()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", *sys.argv[2:]])
with open(out, "a") as f:
    f.write(f"started pid={os.getpid()} child={child.pid}\\n")
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def cluster():
    """A control plane with the node agent's Node and no kwok nodes: every pod runs for real."""
    cluster = Cluster(ClusterOptions(pools=(), kueue=False, agent=True)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(cluster):
    name = f"agent-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def python_pod(name: str, code: str, *args: str, **spec: Any) -> dict[str, Any]:
    """A pod running `python -c code args` on an rlrun image; `spec` extends the pod spec, and
    `container` the container."""
    container = {"name": "main", "image": IMAGE, "command": ["python", "-c", code], "args": list(args)}
    container |= spec.pop("container", {})
    labels = spec.pop("labels", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 5, **spec},
    }


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
    cluster.apply(list(objects))


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def wait_pod(
    cluster: Cluster,
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 90,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        pod = get_pod(cluster, namespace, name)
        if pod is not None and check(pod):
            return pod
        time.sleep(0.3)
    status = json.dumps((pod or {}).get("status"), indent=1)
    pytest.fail(
        f"pod {name}: {what} did not happen in {timeout}s; status: {status}\n{cluster.agent.describe_logs(namespace)}"
    )


def phase(pod: dict[str, Any]) -> str:
    return pod.get("status", {}).get("phase", "")


def condition(pod: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod.get("status", {}).get("containerStatuses") or [{}]
    return status


def logs(cluster: Cluster, namespace: str, pod: str) -> str:
    """`kubectl logs`: the API server asks the agent's kubelet API."""
    return cluster.kubectl("logs", pod, "-n", namespace).stdout


def greeter_objects() -> list[dict[str, Any]]:
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "token"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "greeting"},
            "data": {"greeting.txt": "hello"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "token"},
            "stringData": {"token": "s3cret"},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "greeter"},
            "spec": {"clusterIP": "None", "selector": {"app": "greeter"}, "ports": [{"port": PORT}]},
        },
    ]
    for index in range(2):
        objects.append(
            python_pod(
                f"greeter-{index}",
                SERVER,
                "$(PORT)",  # kubelet's expansion of the container's own variables
                labels={"app": "greeter"},
                container={
                    "env": [*env, {"name": "PORT", "value": str(PORT)}],
                    "volumeMounts": [{"name": "greeting", "mountPath": "/etc/greeter", "readOnly": True}],
                    "readinessProbe": {"httpGet": {"port": PORT, "path": "/"}, "periodSeconds": 1},
                },
                volumes=[{"name": "greeting", "configMap": {"name": "greeting"}}],
            )
        )
    return objects


def test_pods_serve_on_the_same_port_and_find_each_other_through_a_headless_service(cluster, namespace):
    apply(cluster, namespace, *greeter_objects())
    servers = [
        wait_pod(cluster, namespace, f"greeter-{i}", lambda p: condition(p, "Ready") == "True", "Ready")
        for i in range(2)
    ]
    addresses = [pod["status"]["podIP"] for pod in servers]
    assert len(set(addresses)) == 2 and all(pod["spec"]["nodeName"] == cluster.agent.name for pod in servers)
    # The host reaches each pod at its own address (both bound 0.0.0.0:50051 in their namespaces).
    for pod, address in zip(servers, addresses, strict=True):
        body = urllib.request.urlopen(f"http://{address}:{PORT}/", timeout=10).read().decode()
        assert body == f"hello s3cret {pod['metadata']['name']} {address}"
    apply(cluster, namespace, python_pod("client", CLIENT, "greeter", str(PORT), "2", restartPolicy="Never"))
    client = wait_pod(cluster, namespace, "client", lambda p: phase(p) in ("Succeeded", "Failed"), "the end")
    output = logs(cluster, namespace, "client")
    assert phase(client) == "Succeeded", output
    for pod, address in zip(servers, addresses, strict=True):
        assert f"hello s3cret {pod['metadata']['name']} {address}" in output


def test_a_statefulset_pod_resolves_by_its_stable_name(cluster, namespace):
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": PORT}]},
    }
    server = python_pod("unused", SERVER, str(PORT))["spec"]["containers"][0]
    server |= {
        "command": [
            "python",
            "-c",
            "import socket, sys; print(socket.gethostname(), socket.getfqdn(), flush=True)\n" + SERVER,
        ],
        "env": [
            {"name": "TOKEN", "value": "-"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "volumeMounts": [{"name": "greeting", "mountPath": "/etc/greeter"}],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "containers": [server],
                    "terminationGracePeriodSeconds": 5,
                    "volumes": [{"name": "greeting", "configMap": {"name": "greeting"}}],
                },
            },
        },
    }
    greeting = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "greeting"},
        "data": {"greeting.txt": "db"},
    }
    apply(cluster, namespace, greeting, service, statefulset)
    pod = wait_pod(cluster, namespace, "db-0", lambda p: condition(p, "Ready") == "True", "Ready")
    fqdn = f"db-0.db.{namespace}.svc.cluster.local"
    assert logs(cluster, namespace, "db-0").splitlines()[0] == f"db-0 {fqdn}"
    apply(cluster, namespace, python_pod("client", CLIENT, fqdn, str(PORT), "1", restartPolicy="Never"))
    client = wait_pod(cluster, namespace, "client", lambda p: phase(p) in ("Succeeded", "Failed"), "the end")
    output = logs(cluster, namespace, "client")
    assert phase(client) == "Succeeded" and f"db - db-0 {pod['status']['podIP']}" in output, output


def test_a_failing_readiness_probe_keeps_the_pod_unready_until_it_passes(cluster, namespace):
    switch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "switch"},
        "data": {"ready": "no"},
    }
    pod = python_pod(
        "probed",
        HEALTH_SERVER,
        container={
            "volumeMounts": [{"name": "switch", "mountPath": "/etc/switch"}],
            "readinessProbe": {"grpc": {"port": PORT}, "periodSeconds": 1, "failureThreshold": 1},
        },
        volumes=[{"name": "switch", "configMap": {"name": "switch"}}],
    )
    apply(cluster, namespace, switch, pod)
    wait_pod(cluster, namespace, "probed", lambda p: container_status(p).get("started") is True, "started")
    # The health service answers NOT_SERVING: probed every second, the pod never turns ready.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        current = get_pod(cluster, namespace, "probed")
        assert current is not None and phase(current) == "Running"
        assert condition(current, "Ready") == "False" and container_status(current)["ready"] is False
        time.sleep(0.5)
    assert condition(current, "ContainersReady") == "False"
    # An edited ConfigMap reaches the running container (the agent refreshes the volume), the
    # health service turns SERVING, and the next probe makes the pod ready.
    cluster.kubectl(
        "patch", "configmap", "switch", "-n", namespace, "--type=merge", "-p", '{"data":{"ready":"yes"}}'
    )
    wait_pod(
        cluster, namespace, "probed", lambda p: condition(p, "Ready") == "True", "Ready after the switch"
    )


def test_a_crash_loop_shows_back_off_restart_count_and_the_last_exit(cluster, namespace):
    apply(cluster, namespace, python_pod("crasher", "import sys; print('crashing', flush=True); sys.exit(3)"))
    pod = wait_pod(
        cluster,
        namespace,
        "crasher",
        lambda p: container_status(p).get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff",
        "CrashLoopBackOff",
    )
    status = container_status(pod)
    assert status["restartCount"] >= 1, status
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert "back-off 10s restarting failed container=main" in status["state"]["waiting"]["message"]
    assert phase(pod) == "Running" and condition(pod, "Ready") == "False"
    # restartPolicy Never: the same exit is final, and the pod Failed.
    apply(cluster, namespace, python_pod("once", "import sys; sys.exit(3)", restartPolicy="Never"))
    once = wait_pod(cluster, namespace, "once", lambda p: phase(p) == "Failed", "Failed")
    status = container_status(once)
    assert status["restartCount"] == 0 and status["state"]["terminated"]["exitCode"] == 3


def test_deleting_a_pod_sends_sigterm_to_its_main_process_and_the_pod_goes(cluster, namespace, tmp_path):
    out = tmp_path / "signals"
    tmp_path.chmod(0o777)  # the image runs as uid 10001
    marker = f"marker-{uuid.uuid4().hex}"
    pod = python_pod(
        "stopper",
        SIGNALS,
        "/out/signals",
        marker,
        container={"volumeMounts": [{"name": "out", "mountPath": "/out"}]},
        volumes=[{"name": "out", "hostPath": {"path": str(tmp_path), "type": "Directory"}}],
    )
    apply(cluster, namespace, pod)
    wait_pod(cluster, namespace, "stopper", lambda p: phase(p) == "Running", "Running")
    deadline = time.monotonic() + 30
    while not (out.exists() and "started" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker), "the pod's child process runs on the host"
    cluster.kubectl("delete", "pod", "stopper", "-n", namespace, "--wait=true", "--timeout=60s")
    assert get_pod(cluster, namespace, "stopper") is None
    lines = out.read_text().splitlines()
    assert lines[0].startswith("started pid=1 ")  # the container's command is its PID 1
    assert lines[1:] == ["SIGTERM pid=1"], lines
    assert not _processes_with(marker), "a process of the deleted pod is still running"


def test_an_unknown_image_is_an_error_on_the_pod(cluster, namespace):
    pod = python_pod("unknown", "print(1)")
    pod["spec"]["containers"][0]["image"] = "docker.io/library/busybox:1.36"
    apply(cluster, namespace, pod)
    pod = wait_pod(
        cluster, namespace, "unknown", lambda p: "waiting" in container_status(p).get("state", {}), "waiting"
    )
    waiting = container_status(pod)["state"]["waiting"]
    assert waiting["reason"] == "ErrImagePull" and "busybox" in waiting["message"], waiting
    assert phase(pod) == "Pending"


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [pid for pid in found if pid != os.getpid()]


REPORT = """\
import json, os, ssl, urllib.error, urllib.request
report = {k: os.environ.get(k) for k in ("FROM_MAP_a", "MEMORY_MI", "POD_NAMESPACE", "HOME", "HOSTNAME")}
report["sub"] = open("/etc/single/value.txt").read()
report["labels"] = open("/etc/info/labels").read()
report["user"] = [os.getuid(), os.getgid(), sorted(os.getgroups())]
report["cwd"] = os.getcwd()
# An in-cluster client: the projected ServiceAccount token, ca.crt and namespace, and the API
# server at kubernetes.default.svc (as kopf's in-cluster login calls it).
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
namespace = open(f"{sa}/namespace").read()
request = urllib.request.Request(
    f"https://kubernetes.default.svc/api/v1/namespaces/{namespace}/pods",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read()},
)
try:
    urllib.request.urlopen(request, context=ssl.create_default_context(cafile=f"{sa}/ca.crt"), timeout=10)
    report["api"] = 200
except urllib.error.HTTPError as error:
    report["api"] = error.code
    report["api_message"] = json.loads(error.read())["message"]
print(json.dumps(report), flush=True)
"""


def test_environment_volumes_and_identity_are_the_pods(cluster, namespace):
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "map"},
        "data": {"a": "1", "value.txt": "sub-value"},
    }
    pod = python_pod(
        "report",
        REPORT,
        restartPolicy="Never",
        labels={"app": "env"},
        securityContext={"runAsUser": 2000, "runAsGroup": 3000, "fsGroup": 4000},
        container={
            "workingDir": "/srv/app",
            "envFrom": [{"configMapRef": {"name": "map"}, "prefix": "FROM_MAP_"}],
            "env": [
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {
                    "name": "MEMORY_MI",
                    "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
                },
            ],
            "resources": {"limits": {"memory": "64Mi"}},
            "volumeMounts": [
                {"name": "map", "mountPath": "/etc/single/value.txt", "subPath": "value.txt"},
                {"name": "info", "mountPath": "/etc/info"},
            ],
        },
        volumes=[
            {"name": "map", "configMap": {"name": "map"}},
            {
                "name": "info",
                "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
            },
        ],
    )
    apply(cluster, namespace, config, pod)
    done = wait_pod(cluster, namespace, "report", lambda p: phase(p) in ("Succeeded", "Failed"), "the end")
    output = logs(cluster, namespace, "report")
    assert phase(done) == "Succeeded", output
    report = json.loads(output.splitlines()[-1])
    assert (
        report["FROM_MAP_a"] == "1" and report["MEMORY_MI"] == "64" and report["POD_NAMESPACE"] == namespace
    )
    assert report["HOSTNAME"] == "report" and report["HOME"] == "/"  # uid 2000 has no passwd entry
    assert report["sub"] == "sub-value" and report["labels"] == 'app="env"\n'
    assert report["user"] == [2000, 3000, [3000, 4000]] and report["cwd"] == "/srv/app"
    # The token authenticated (403, not 401): the default ServiceAccount may not list pods.
    assert report["api"] == 403 and f"system:serviceaccount:{namespace}:default" in report["api_message"], (
        report
    )


LIVENESS = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open("/tmp/healthy", "w").close()
time.sleep(6)
os.remove("/tmp/healthy")
time.sleep(3600)
"""
HEALTHY = ["python", "-c", "import os, sys; sys.exit(0 if os.path.exists('/tmp/healthy') else 1)"]


def test_exec_probes_run_inside_the_container_and_a_failed_liveness_probe_restarts_it(cluster, namespace):
    # /tmp/healthy exists only in the container's own root: the probes see it only from inside.
    probe = {"exec": {"command": HEALTHY}, "periodSeconds": 1, "failureThreshold": 2}
    pod = python_pod("live", LIVENESS, container={"startupProbe": probe, "livenessProbe": probe})
    apply(cluster, namespace, pod)
    started = wait_pod(
        cluster, namespace, "live", lambda p: container_status(p).get("started") is True, "started"
    )
    assert container_status(started)["restartCount"] == 0
    restarted = wait_pod(
        cluster, namespace, "live", lambda p: container_status(p).get("restartCount", 0) >= 1, "a restart"
    )
    last = container_status(restarted)["lastState"]["terminated"]
    assert last["exitCode"] == 0 and last["reason"] == "Completed"  # its SIGTERM handler exited 0
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=live")[
        "items"
    ]
    assert any(e["reason"] == "Killing" and "failed liveness probe" in e["message"] for e in events), events
