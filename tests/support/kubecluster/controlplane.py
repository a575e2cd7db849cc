"""A Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, built by `make k8s-tools` from k8s.io/kubernetes and go.etcd.io/etcd.

Nothing is emulated. The API server authenticates by client certificate and service-account
token, authorizes with Node and RBAC, and runs its default admission plugins plus
ExtendedResourceToleration (a pod that asks for `nvidia.com/gpu` tolerates the GPU nodes'
`nvidia.com/gpu` taint, as on managed GPU node pools) and OwnerReferencesPermissionEnforcement. It writes an audit log of every request
(`audit.jsonl`), which is how the tests learn which API calls the operator makes. The
controller-manager runs every default controller (garbage collector, Deployment, ReplicaSet,
StatefulSet, ServiceAccount and token controllers, EndpointSlices, the PersistentVolume binder,
disruption budgets, node lifecycle, namespaces), each with its own service account as kubeadm
sets it up, so that the bootstrap RBAC roles decide what each may do.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .pki import Authority, KeyPair, service_account_keys
from .processes import Process, free_port, tool, wait_for

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"

# Every request, with who made it and the answer's code; request bodies are left out (the
# tests need verbs and resources, not Secrets' contents).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: dict[str, str],
    namespace: str = "default",
    name: str = "rlrun-test",
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
                "users": [{"name": name, "user": user}],
                "contexts": [
                    {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
                ],
                "current-context": name,
            }
        )
    )
    path.chmod(0o600)
    return path


@dataclass
class ControlPlane:
    """Start with `start()`, stop with `stop()`; `kubeconfig` is the admin's."""

    workdir: Path
    bind_address: str = "127.0.0.1"
    """The API server's address: loopback, or the node agent's bridge so that pods reach it."""
    processes: list[Process] = field(default_factory=list)
    port: int = 0
    """The API server's port: a free one if 0 (the node agent's cluster uses 443, see kubecluster.agent.coredns)."""
    kubeconfig: Path = field(init=False)
    ca: Path = field(init=False)
    authority: Authority = field(init=False)

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.port}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.jsonl"

    def start(self) -> ControlPlane:
        pki = self.workdir / "pki"
        self.authority = Authority(pki)
        self.ca = self.authority.cert
        self.port = self.port or free_port(self.bind_address)
        hosts = (
            "127.0.0.1",
            self.bind_address,
            "10.96.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        )
        serving = self.authority.issue("apiserver", "kube-apiserver", hosts=hosts, server=True)
        service_accounts = service_account_keys(pki)
        admin = self.authority.issue("admin", "rlrun-test-admin", organization="system:masters")
        self.kubeconfig = self.client_kubeconfig("admin", admin)
        self._start_etcd()
        self._start_apiserver(serving, service_accounts)
        self._start_controller_manager(service_accounts)
        self._start_scheduler()
        return self

    def client_kubeconfig(self, name: str, pair: KeyPair) -> Path:
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            self.server,
            self.ca,
            {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
        )

    def token_kubeconfig(self, name: str, token: str, namespace: str = "default") -> Path:
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig", self.server, self.ca, {"token": token}, namespace
        )

    def _run(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.logs)
        self.processes.append(process)
        return process

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._run(
            "etcd",
            [
                tool("etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                # The data dies with the test run: no fsync, so that 2 cores are not spent waiting on disk.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_for(lambda: _http_ok(f"{self.etcd_url}/health"), 60, "etcd /health", etcd)

    def _start_apiserver(self, serving: KeyPair, service_accounts: KeyPair) -> None:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        advertise = self.bind_address
        # How the API server authenticates to kubelets (`kubectl logs` through the node agent), as kubeadm sets it up.
        kubelet_client = self.authority.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters"
        )
        apiserver = self._run(
            "kube-apiserver",
            [
                tool("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.bind_address}",
                f"--secure-port={self.port}",
                f"--advertise-address={advertise}",
                # A loopback address may not be an Endpoints address: with the API server on
                # loopback, the `kubernetes` Service gets no endpoints (nothing in a pod uses it).
                f"--endpoint-reconciler-type={'none' if advertise.startswith('127.') else 'lease'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
                f"--service-account-key-file={service_accounts.cert}",
                f"--service-account-signing-key-file={service_accounts.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # OwnerReferencesPermissionEnforcement, as hardened clusters (OpenShift) run it: an
                # owner reference with blockOwnerDeletion needs `update` on the owner's finalizers.
                # NodeRestriction: a node (the node agent) may change only itself and its own pods.
                "--enable-admission-plugins=ExtendedResourceToleration,OwnerReferencesPermissionEnforcement,NodeRestriction",
                "--allow-privileged=true",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
                "--v=1",
            ],
        )
        wait_for(lambda: self.get("/readyz") == "ok", 120, "kube-apiserver /readyz", apiserver)

    def _component_kubeconfig(self, name: str, common_name: str) -> Path:
        return self.client_kubeconfig(name, self.authority.issue(name, common_name))

    def _start_controller_manager(self, service_accounts: KeyPair) -> None:
        kubeconfig = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        self._run(
            "kube-controller-manager",
            [
                tool("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={service_accounts.key}",
                f"--root-ca-file={self.ca}",
                f"--cluster-signing-cert-file={self.ca}",
                f"--cluster-signing-key-file={self.authority.key}",
                "--leader-elect=false",
                # The garbage collector and the workload controllers react at once, as on a
                # real cluster's default settings; only the node monitor waits 2 min (default
                # 50 s) for a node Lease renewal: kwok renews every 10 s, but on 2 cores shared
                # with a test run a renewal can lag, and a node marked NotReady marks its pods
                # not Ready, which kwok (unlike a kubelet) never sets back.
                "--node-monitor-grace-period=2m",
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        kubeconfig = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        self._run(
            "kube-scheduler",
            [
                tool("kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ],
        )

    # --- the admin's HTTP access, for readiness checks and small reads without a client library

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        pki = self.workdir / "pki"
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return context

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.server}{path}", context=self._context(), timeout=10) as response:
            body = response.read().decode()
        try:
            return json.loads(body)
        except ValueError:
            return body

    def stop(self) -> None:
        errors = []
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception as error:  # noqa: BLE001 - stop the rest, then report
                errors.append(error)
        self.processes.clear()
        if errors:
            raise errors[0]


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200
