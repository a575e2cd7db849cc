"""The Events kubelet records about a pod (Started, Killing, Unhealthy, BackOff, Failed,
FailedMount), so that `kubectl describe pod` and `kubectl get events` tell what happened on the
node. One Event per occurrence; a failure to record one is logged, never fatal."""

from __future__ import annotations

import logging
import time
from typing import Any

from .kube import ApiError, Kube

log = logging.getLogger("kubecluster.agent")


def record(
    kube: Kube,
    node: str,
    pod: dict[str, Any],
    reason: str,
    message: str,
    warning: bool = False,
    container: str | None = None,
) -> None:
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    if container is not None:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.create(f"/api/v1/namespaces/{meta['namespace']}/events", body)
    except ApiError as error:
        log.warning("event %s for %s/%s not recorded: %s", reason, meta["namespace"], meta["name"], error)
