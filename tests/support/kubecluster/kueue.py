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


def configuration(port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": FRAMEWORKS},
    }


def start_kueue(
    workdir: Path, kubeconfig: Path, authority: Authority
) -> tuple[Process, int, list[dict[str, Any]]]:
    """Starts Kueue's manager; returns it, its health port and the manifests to apply (after
    the CRDs exist it can start its controllers, after the webhooks it admits)."""
    port = free_port()
    cert_dir = workdir / "kueue-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    pair = authority.issue("kueue-webhook", "kueue-webhook", hosts=("127.0.0.1",), server=True)
    (cert_dir / "tls.crt").write_bytes(pair.cert.read_bytes())
    (cert_dir / "tls.key").write_bytes(pair.key.read_bytes())
    config = configuration(port, cert_dir)
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    health = int(config["health"]["healthProbeBindAddress"].rsplit(":", 1)[1])
    process = Process(
        "kueue",
        [tool("kueue"), f"--config={config_path}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"],
        workdir / "logs",
    )
    return process, health, manifests(port, authority.cert)
