"""Kueue (sigs.k8s.io/kueue, its controller manager built by `make k8s-tools`) on loopback.

Installed as its release manifests install it, with two changes a process outside the cluster
needs: its webhooks (pod, Deployment and StatefulSet admission, CRD conversion) are called at
`https://127.0.0.1:PORT` with our CA instead of through a Service, and their certificate comes
from our CA instead of Kueue's internal certificate manager. The namespace selectors of the
pod, Deployment and StatefulSet webhooks are those of Kueue's own kustomization."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from .pki import Authority
from .processes import TOOLS, ClusterError, Process, free_port, tool

# Kueue's kustomization patches these webhooks to skip its own and the system namespaces.
SKIPPED_NAMESPACES = ["kube-system", "kueue-system"]
SELECTED_WEBHOOKS = {
    "mpod.kb.io",
    "mdeployment.kb.io",
    "mstatefulset.kb.io",
    "vpod.kb.io",
    "vdeployment.kb.io",
    "vstatefulset.kb.io",
}
CONVERTED_CRDS = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
FRAMEWORKS = ["batch/job", "pod", "deployment", "statefulset"]


def _bundle(ca: Path) -> str:
    return base64.b64encode(ca.read_bytes()).decode()


def manifests(port: int, ca: Path) -> list[dict[str, Any]]:
    """Kueue's CRDs and webhook configurations, pointed at the webhook server on loopback."""
    folder = TOOLS / "kueue"
    if not (folder / "webhooks.yaml").exists():
        raise ClusterError(f"{folder} is missing Kueue's manifests: run `make k8s-tools`")
    url = f"https://127.0.0.1:{port}"
    out = []
    for path in sorted((folder / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": _bundle(ca)},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    for config in yaml.safe_load_all((folder / "webhooks.yaml").read_text()):
        if not config:
            continue
        config = copy.deepcopy(config)
        config["metadata"]["name"] = f"kueue-{config['metadata']['name']}"
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": _bundle(ca)}
            if hook["name"] in SELECTED_WEBHOOKS:
                hook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": SKIPPED_NAMESPACES,
                        }
                    ]
                }
        out.append(config)
    return out


def configuration(port: int, cert_dir: Path, health_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": FRAMEWORKS},
    }


class Kueue:
    """Kueue's manifests and its manager: apply `crds`, then `start()`, then (once its webhook
    server is up, `ready_url`) apply `webhooks`."""

    def __init__(self, workdir: Path, kubeconfig: Path, authority: Authority):
        self.workdir, self.kubeconfig, self.authority = workdir, kubeconfig, authority
        self.port = free_port()
        objects = manifests(self.port, authority.cert)
        self.crds = [m for m in objects if m["kind"] == "CustomResourceDefinition"]
        self.webhooks = [m for m in objects if m["kind"] != "CustomResourceDefinition"]
        self.health_port = free_port()

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/readyz"

    def start(self) -> Process:
        workdir, authority = self.workdir, self.authority
        cert_dir = workdir / "kueue-certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        pair = authority.issue("kueue-webhook", "kueue-webhook", hosts=("127.0.0.1",), server=True)
        (cert_dir / "tls.crt").write_bytes(pair.cert.read_bytes())
        (cert_dir / "tls.key").write_bytes(pair.key.read_bytes())
        config = configuration(self.port, cert_dir, self.health_port)
        config_path = workdir / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        # Without its internal certificate manager, Kueue reads its metrics server's certificate
        # from a fixed path, /etc/kueue/metrics/certs: it runs in a mount namespace of its own
        # whose /etc is an overlay of the host's, so that the path exists for Kueue alone.
        etc = workdir / "kueue-etc"
        for part in ("upper/kueue/metrics/certs", "work"):
            (etc / part).mkdir(parents=True, exist_ok=True)
        metrics = authority.issue("kueue-metrics", "kueue-metrics", hosts=("127.0.0.1",), server=True)
        (etc / "upper/kueue/metrics/certs/tls.crt").write_bytes(metrics.cert.read_bytes())
        (etc / "upper/kueue/metrics/certs/tls.key").write_bytes(metrics.key.read_bytes())
        command = " ".join(
            [
                f"mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/upper,workdir={etc}/work /etc &&",
                f"exec {tool('kueue')} --config={config_path} --kubeconfig={self.kubeconfig} --zap-log-level=info"
                # The on-demand visibility API server needs certificates at /visibility; not used here.
                " --feature-gates=VisibilityOnDemand=false",
            ]
        )
        return Process(
            "kueue", ["unshare", "--mount", "--propagation", "private", "sh", "-c", command], workdir / "logs"
        )
