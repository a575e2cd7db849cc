"""What the operator asks of the real API server for one run, from the audit log: the figures
`rlrun bench operator-scale` measures at scale, held here as counts for a single run."""

from __future__ import annotations

from collections import Counter

from .runs import KEPT, WORKLOADS, all_pods_ready, call, sample


def child_applies(events: list[dict], user: str, namespace: str) -> Counter[str]:
    """How many times the operator applied each child (resource/name), the Secret aside: it is
    applied on every pass, unread (the operator may not read Secrets)."""
    return Counter(
        f"{ref['resource']}/{ref['name']}"
        for event in events
        if event["user"]["username"] == user
        and event["verb"] == "patch"
        and event.get("stage") == "ResponseComplete"
        and (ref := event.get("objectRef") or {}).get("namespace") == namespace
        and ref.get("resource") not in ("secrets", "rlruns")
    )


async def test_a_new_run_applies_each_child_once(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually, operator_account
):
    """kopf runs the status timer beside the create handler; two passes of a new run would each
    find its children missing and apply every one of them twice (seen in the scale bench: two
    passes per new run, each child created by one and re-applied by the other)."""
    user = f"system:serviceaccount:rlrun-system:{operator_account}"
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    before = len(await call(cluster.audit_events))
    await call(kube.create, sample(namespace))
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="4 pods Ready")
    polled = orchestrator_stub.calls
    await eventually(lambda: orchestrator_stub.calls >= polled + 3, message="three more status passes")
    applies = child_applies((await call(cluster.audit_events))[before:], user, namespace)
    resources = {
        "ConfigMap": "configmaps",
        "Service": "services",
        "PersistentVolumeClaim": "persistentvolumeclaims",
    }
    resources |= {"StatefulSet": "statefulsets", "Deployment": "deployments"}
    expected = {f"{resources[kind]}/{name}" for _, kind, name in WORKLOADS | KEPT}
    assert set(applies) >= expected
    assert {child: count for child, count in applies.items() if count != 1} == {}
