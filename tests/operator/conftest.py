"""The operator tests' Kubernetes: a real control plane (tests/support/kubecluster), started once
per session: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok's GPU and CPU
nodes, a volume provisioner and Kueue, from the binaries `make k8s-tools` builds. Nothing here
emulates an API server.

The chart is installed into it with `helm install` (the CRD from the chart's crds/, the
ServiceAccount, the ClusterRole and its binding), and the operator under test authenticates
with a token of the chart's ServiceAccount, so the API server's RBAC authorizer decides what
it may do. Each test gets a namespace of its own; the test's actions and assertions go through
the API as the cluster's admin.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support"))

from kubecluster import Cluster  # noqa: E402

CHART = REPO / "charts" / "rlrun"
OPERATOR_NAMESPACE = "rlrun-system"
RELEASE = "rlrun"
SAMPLE_PATH = REPO / "configs" / "k8s" / "rlrun.yaml"


def load_sample(path: Path = SAMPLE_PATH, namespace: str | None = None) -> dict[str, Any]:
    run = yaml.safe_load(path.read_text())
    if namespace is not None:
        run["metadata"]["namespace"] = namespace
    return run


@pytest.fixture(scope="session")
def cluster():
    """The running cluster, with the chart installed as a user installs it."""
    cluster = Cluster().start()
    try:
        cluster.install_chart(release=RELEASE, namespace=OPERATOR_NAMESPACE)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def operator_account(cluster) -> str:
    """The chart's ServiceAccount, as the RBAC user name the audit log records."""
    name = cluster.get_json(
        "serviceaccount", "-n", OPERATOR_NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}"
    )
    (account,) = name["items"]
    return account["metadata"]["name"]


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster, operator_account) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount: what the operator's pod gets."""
    return cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, operator_account)


@pytest.fixture(scope="session")
def token_key(cluster) -> bytes:
    """The key the chart generated (its Secret, read as the admin): every run's credentials
    derive from it, as in the operator's pod."""
    import base64

    secrets = cluster.get_json("secret", "-n", OPERATOR_NAMESPACE)
    (secret,) = [s for s in secrets["items"] if s["metadata"]["name"].endswith("token-key")]
    return base64.b64decode(secret["data"]["key"])


RUN_NAMESPACES: list[str] = ["default"]
"""The chart's operator.runNamespaces so far (where the operator may write run Secrets)."""


def allow_runs_in(cluster, namespace: str) -> None:
    """What an admin does for a new team namespace: adds it to the chart's runNamespaces."""
    RUN_NAMESPACES.append(namespace)
    cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--reuse-values",
        "--set-json",
        f"operator.runNamespaces={json.dumps(RUN_NAMESPACES)}",
    )


def new_namespace(cluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    return name


def release_namespace(cluster, name: str) -> None:
    """Releases its RLRuns' finalizers (the operator is gone by then) and deletes it, so that
    the namespace controller can delete everything. The chart's next upgrade drops its Role."""
    if name in RUN_NAMESPACES:
        RUN_NAMESPACES.remove(name)
    runs = cluster.get_json("rlruns", "-n", name)
    for run in runs["items"]:
        cluster.kubectl(
            "patch",
            "rlrun",
            run["metadata"]["name"],
            "-n",
            name,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            check=False,
        )
    cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def namespace(cluster):
    """A namespace of the test's own, where the chart lets the operator run runs."""
    name = new_namespace(cluster)
    allow_runs_in(cluster, name)
    yield name
    release_namespace(cluster, name)


@pytest.fixture
def unlisted_namespace(cluster):
    """A namespace the chart's runNamespaces does not list."""
    name = new_namespace(cluster)
    yield name
    release_namespace(cluster, name)


@pytest.fixture
def api_client(cluster):
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture
def kube(api_client):
    """The admin's client (the tests' own reads and writes)."""
    from rlrun.operator.kube import Kube

    return Kube(api_client, timeout_s=30)


@pytest.fixture
def kubectl(cluster, namespace):
    """Runs kubectl as the admin in the test's namespace; returns (code, stdout, stderr)."""

    async def run(*args: str, check: bool = True, input: str | None = None) -> tuple[int, str, str]:
        result = await asyncio.to_thread(cluster.kubectl, "-n", namespace, *args, check=check, input=input)
        return result.returncode, result.stdout, result.stderr

    return run


async def _eventually(check, timeout: float = 30.0, interval: float = 0.2, message: str = ""):
    """Polls `check()` until it returns a truthy value; returns that value. A plain function runs
    in a thread (the clients block)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = await check() if inspect.iscoroutinefunction(check) else await asyncio.to_thread(check)
            if value:
                return value
            last_error = None
        except (AssertionError, KeyError, TypeError, IndexError, OSError) as error:
            last_error = error
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s: {message}" + (f" (last: {last_error!r})" if last_error else "")
            )
        await asyncio.sleep(interval)


@pytest.fixture
def eventually():
    return _eventually


@pytest.fixture
async def orchestrator_stub():
    """A stand-in OrchestratorService on 127.0.0.1 (the run's real orchestrator runs in a kwok
    pod, which runs nothing): GetStatus answers `stub.response`."""
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

    class Stub(orchestrator_pb2_grpc.OrchestratorServiceServicer):
        def __init__(self) -> None:
            self.response = orchestrator_pb2.GetRunStatusResponse(phase=orchestrator_pb2.RUN_PHASE_PENDING)
            self.calls = 0
            self.port = 0
            self.authorization: str | None = None
            """The `authorization` metadata of the last call."""

        async def GetStatus(self, request, context):  # noqa: N802 - gRPC method name
            self.calls += 1
            self.authorization = dict(context.invocation_metadata()).get("authorization")
            return self.response

    stub = Stub()
    server = grpc.aio.server()
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(stub, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    stub.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield stub
    await server.stop(grace=None)


@dataclass
class RunningOperator:
    options: Any
    stop_flag: threading.Event
    thread: threading.Thread

    async def stop(self) -> None:
        self.stop_flag.set()
        await asyncio.to_thread(self.thread.join, 30)
        assert not self.thread.is_alive(), "kopf did not stop"


def operator_login(cluster, kubeconfig: Path) -> Callable[[], Any]:
    import kopf

    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]

    def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.server, ca_path=str(cluster.control_plane.ca), token=token)

    return login


@pytest.fixture
async def run_operator(cluster, operator_kubeconfig, token_key, request):
    """Starts the real kopf operator (our registry and settings) in a thread, as the chart's
    ServiceAccount, watching the test's namespace (or those of `watch=[...]`).

    kopf runs in a thread with its own event loop: on exit it cancels every task created after
    its start in its loop, which would include the test's own fixture teardown."""
    import dataclasses

    import kopf

    from rlrun.operator.handlers import OperatorOptions, build_registry, configure_settings
    from rlrun.operator.reconcile import Defaults

    running: list[RunningOperator] = []

    async def start(**overrides: Any) -> RunningOperator:
        watch = overrides.pop("watch", None) or [request.getfixturevalue("namespace")]
        defaults = overrides.pop("defaults", None) or Defaults()
        options = OperatorOptions(
            defaults=dataclasses.replace(defaults, token_key=token_key),
            api_client_factory=lambda: cluster.api_client(operator_kubeconfig),
            login=operator_login(cluster, operator_kubeconfig),
            **overrides,
        )
        settings = configure_settings(kopf.OperatorSettings(), options)
        settings.watching.reconnect_backoff = 0.1
        settings.queueing.idle_timeout = 0.5
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(
            target=kopf.run,
            kwargs=dict(
                registry=build_registry(options),
                settings=settings,
                namespaces=watch,
                standalone=True,
                stop_flag=stop,
                ready_flag=ready,
            ),
            name="kopf",
            daemon=True,
        )
        thread.start()
        operator = RunningOperator(options, stop, thread)
        running.append(operator)
        assert await asyncio.to_thread(ready.wait, 30), "kopf did not start"
        return operator

    yield start
    for operator in running:
        await operator.stop()
