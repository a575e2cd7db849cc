"""The agent process: it registers its Node (CPU only: no GPU capacity, and no kwok annotation,
so kwok leaves it alone), keeps it Ready (the node Lease in kube-node-lease and the Ready
condition's heartbeat), watches the pods bound to it and runs one PodWorker per pod.

It authenticates as a kubelet does, with a client certificate `CN=system:node:<name>,
O=system:nodes`, so the API server's Node authorizer (and the NodeRestriction admission plugin)
decide what it may read and write: its own Node and Lease, the status and deletion of its own
pods, and only the Secrets, ConfigMaps, claims and token requests of the pods bound to it."""

from __future__ import annotations

import ipaddress
import logging
import os
import platform
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import AgentConfig
from .kube import ApiError, Kube
from .network import Addresses, Bridge
from .pods import PodWorker
from .server import KubeletServer

log = logging.getLogger("kubecluster.agent")

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
SHUTDOWN_GRACE_S = 15.0
"""The longest a pod gets to stop when the agent itself stops (each pod's own grace period if
shorter)."""


def micro_time() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.folder = Path(config.folder)
        self.repo = Path(config.repo)
        self.venv = Path(config.python).parent.parent
        self.kube = Kube(Path(config.kubeconfig))
        network = ipaddress.ip_network(config.network)
        self.bridge = Bridge(config.bridge, network)
        self.node_ip = self.bridge.gateway
        self.addresses = Addresses(network)
        self.allocatable = dict(config.capacity)
        self.traverse = _ancestors(Path(config.python).resolve())
        self.service_env = _service_env(config.api_host, config.api_port)
        self.stopping = threading.Event()
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self.server: KubeletServer | None = None

    # --- API access for the pods

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.kube.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)

    # --- the node

    def node_object(self) -> dict[str, Any]:
        config = self.config
        labels = {
            "kubernetes.io/hostname": config.node,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **config.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": config.node, "labels": labels},
            "spec": {"podCIDR": config.network, "podCIDRs": [config.network]},
            "status": self.node_status(),
        }

    def node_status(self) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            (
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "the rlrun test node agent is posting ready status"),
        ]
        uname = platform.uname()
        return {
            "capacity": dict(self.config.capacity),
            "allocatable": dict(self.allocatable),
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": self._started_at,
                }
                for kind, status, reason, message in conditions
            ],
            # No Hostname address: the API server would try it first for `kubectl logs`, and the
            # node's name resolves nowhere.
            "addresses": [{"type": "InternalIP", "address": self.node_ip}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.server.port if self.server else 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": uname.release,
                "osImage": "rlrun test node agent",
                "containerRuntimeVersion": "rlrun-agent://0.1",
                "kubeletVersion": "v1.37.0-rlrun-agent",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def register(self) -> None:
        self._started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self._node = self.kube.create("/api/v1/nodes", self.node_object())
        except ApiError as error:
            if error.status != 409:
                raise
            self._node = self.kube.merge_patch(
                f"/api/v1/nodes/{self.config.node}/status", {"status": self.node_status()}
            )
        self._heartbeat()

    def _heartbeat(self) -> None:
        name = self.config.node
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
        try:
            self.kube.merge_patch(path, {"spec": {"renewTime": micro_time(), "holderIdentity": name}})
        except ApiError as error:
            if error.status != 404:
                raise
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node["metadata"]["uid"]}
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": LEASE_DURATION_S,
                    "renewTime": micro_time(),
                },
            }
            self.kube.create(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", lease)
        self.kube.merge_patch(
            f"/api/v1/nodes/{name}/status", {"status": {"conditions": self.node_status()["conditions"]}}
        )

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.config.heartbeat_s):
            try:
                self._heartbeat()
            except Exception as error:  # noqa: BLE001 - the API server may be restarting
                log.warning("node heartbeat failed: %s", error)

    # --- pods

    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.config.node}"
        while not self.stopping.is_set():
            try:
                listing = self.kube.get("/api/v1/pods", fieldSelector=selector)
                seen = {pod["metadata"]["uid"] for pod in listing["items"]}
                with self._lock:
                    gone = [worker for uid, worker in self._workers.items() if uid not in seen]
                for worker in gone:
                    worker.remove()
                for pod in listing["items"]:
                    self._pod_event("MODIFIED", pod)
                version = listing["metadata"]["resourceVersion"]
                for event in self.kube.watch("/api/v1/pods", version, fieldSelector=selector):
                    if self.stopping.is_set():
                        return
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    if event["type"] != "BOOKMARK":
                        self._pod_event(event["type"], event["object"])
            except Exception as error:  # noqa: BLE001 - the API server may be restarting
                if not self.stopping.is_set():
                    log.warning("pod watch failed: %s", error)
                    time.sleep(1)

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None and kind != "DELETED" and not self.stopping.is_set():
                worker = self._workers[uid] = PodWorker(self, pod)
                worker.thread.start()
                return
        if worker is None:
            return
        if kind == "DELETED":
            worker.remove()
        else:
            worker.update(pod)

    # --- the process

    def log_file(
        self, namespace: str, pod: str, container: str, previous: bool
    ) -> tuple[Path, Callable[[], bool]] | None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            meta = worker.pod["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, pod):
                return worker.log_file(container, previous)
        return None

    def run(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.config
        if config.kubelet_cert:
            self.server = KubeletServer(
                self.node_ip,
                config.kubelet_port,
                config.kubelet_cert,
                config.kubelet_key,
                config.client_ca,
                self.log_file,
            ).start()
        self.register()
        log.info("node %s registered (%s, pods on %s)", self.config.node, self.node_ip, self.config.network)
        threads = [
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True),
            threading.Thread(target=self._watch_pods, name="pod watch", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.stopping.wait()
        log.info("stopping: every pod on the node stops")
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.shutdown(SHUTDOWN_GRACE_S)
        for worker in workers:
            worker.thread.join()
        if self.server is not None:
            self.server.stop()
        log.info("stopped")


def _ancestors(path: Path) -> list[str]:
    return [str(parent) for parent in reversed(path.parents) if str(parent) != "/"]


def _service_env(host: str, port: int) -> dict[str, str]:
    """The `kubernetes` Service's variables, which kubelet sets in every container. Their address
    is the API server's own (the node's bridge address), not the Service's cluster IP: the test
    cluster has no kube-proxy, so cluster IPs lead nowhere, and in-cluster clients (kopf's
    in-cluster login) go straight to the API server."""
    url = f"tcp://{host}:{port}"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": url,
        f"KUBERNETES_PORT_{port}_TCP": url,
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


def serve(config: AgentConfig) -> None:
    """Runs the agent until SIGTERM or SIGINT."""
    agent = Agent(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stopping.set())
    agent.run()


def run_as_init(main: Any) -> int:
    """PID 1 of the agent's PID namespace: forks the agent, reaps every orphan (the processes of
    containers whose parent went first), passes SIGTERM and SIGINT on, and exits with the agent."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            main()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(child, number))
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)
