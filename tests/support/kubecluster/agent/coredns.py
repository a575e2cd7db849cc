"""The cluster's DNS: CoreDNS (built by `make k8s-tools`) on the pod network's host address,
port 53, its kubernetes plugin watching the API server as `system:coredns` with kubeadm's
ClusterRole for it. rlrun's Services are headless, so names resolve to the ready pods' IPs,
and a StatefulSet's pods to `<pod>.<service>.<namespace>.svc.cluster.local` (their hostname and
subdomain, which the EndpointSlice controller copies into the slices).

The test cluster has no kube-proxy, so a Service's cluster IP leads nowhere. In-cluster clients
reach the API server all the same: `kubernetes.default.svc` resolves to the API server's own
address, where it listens on 443 (kopf's in-cluster login, for one, calls
https://kubernetes.default.svc whatever KUBERNETES_SERVICE_HOST says)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from ..controlplane import CLUSTER_DOMAIN, ControlPlane
from ..processes import Process, free_port, tool, wait_for

USER = "system:coredns"
HTTPS_PORT = 443
"""The API server's port in a cluster with the node agent, the `kubernetes` Service's port."""
RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": USER},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    },
]


def corefile(address: str, api_host: str, kubeconfig: Path, ready_port: int) -> str:
    # No cache: a Service's name resolves as soon as its endpoints are ready, as tests expect.
    return f"""\
.:53 {{
    bind {address}
    errors
    ready 127.0.0.1:{ready_port}
    hosts {{
        {api_host} kubernetes.default.svc.{CLUSTER_DOMAIN}
        fallthrough
    }}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} rlrun-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
"""


def start_coredns(address: str, control_plane: ControlPlane, folder: Path) -> Process:
    """Starts CoreDNS (its RBAC must exist) and waits until its kubernetes plugin has synced."""
    pair = control_plane.authority.issue("coredns", USER)
    kubeconfig = control_plane.client_kubeconfig("coredns", pair)
    ready_port = free_port()
    config = folder / "Corefile"
    config.write_text(corefile(address, control_plane.bind_address, kubeconfig, ready_port))
    process = Process("coredns", [tool("coredns"), "-conf", str(config)], control_plane.logs)
    wait_for(lambda: _ready(ready_port), 60, "CoreDNS /ready", process)
    return process


def _ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as response:
        return response.status == 200
