"""Generic Kubernetes object builders: plain dicts, nothing RLRun-specific.

Each function takes the object's metadata (`object_meta`) and the few fields that differ
between the run's objects; the choices every object of a run shares (headless Services,
Parallel StatefulSets, PodDisruptionBudgets of one pod at a time) are made here once. What an
RLRun asks of each component lives in rlrun.operator.components, and the run-wide pieces (labels,
pod templates) in rlrun.operator.builder.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any


def object_meta(name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any]) -> dict[str, Any]:
    """Metadata of an object the run owns (`owner` is its controller reference)."""
    return {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]}


def headless_service(
    meta: dict[str, Any],
    selector: dict[str, str],
    ports: Iterable[dict[str, Any]],
    *,
    publish_not_ready: bool = False,
) -> dict[str, Any]:
    """A headless Service (per-pod DNS, and every pod's address for a `dns:///` gRPC target)."""
    spec: dict[str, Any] = {"clusterIP": "None", "selector": dict(selector), "ports": list(ports)}
    if publish_not_ready:
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def stateful_set(
    meta: dict[str, Any], replicas: int, selector: dict[str, str], template: dict[str, Any]
) -> dict[str, Any]:
    """A StatefulSet governed by the headless Service of the same name; its pods start and stop
    in parallel (the run's pods wait for each other themselves)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "serviceName": meta["name"],
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": dict(selector)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": template,
        },
    }


def deployment(
    meta: dict[str, Any],
    replicas: int,
    selector: dict[str, str],
    template: dict[str, Any],
    *,
    recreate: bool,
) -> dict[str, Any]:
    """A Deployment; `recreate` stops the old pod before the new one starts (one writer)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(selector)},
            "strategy": {"type": "Recreate"} if recreate else {"type": "RollingUpdate"},
            "template": template,
        },
    }


def disruption_budget(meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """At most one of the selected pods away at a time (drains, consolidation)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": dict(selector)},
            # A pod that is not ready (crash-looping, still loading) may always go: it
            # serves nothing, and counting it would stall drains behind a broken pod.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def config_map(meta: dict[str, Any], data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}


def secret(meta: dict[str, Any], data: dict[str, str]) -> dict[str, Any]:
    """An Opaque Secret of the given text values (base64-encoded here)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def persistent_volume_claim(
    meta: dict[str, Any], access_modes: Iterable[str], size: str, storage_class: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": list(access_modes), "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def network_policy(
    meta: dict[str, Any], pod_selector: dict[str, Any], ingress: list[dict[str, Any]]
) -> dict[str, Any]:
    """An ingress-only NetworkPolicy (egress stays open) over the selected pods."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {"podSelector": pod_selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def namespace_peers(names: Iterable[str], pods: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """NetworkPolicy peers: the named namespaces (only `pods` in them, when given)."""
    peers = []
    for name in names:
        peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}
        if pods is not None:
            peer["podSelector"] = pods
        peers.append(peer)
    return peers


def tcp_ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": number} for number in numbers]
