"""The chart's RBAC against what the operator really does: a whole run's life (a queued run
admitted by Kueue, scaled up and down, suspended, resumed, finished, expired by its TTL) with
the operator authenticated as the chart's ServiceAccount, then every request it made, as the
API server's audit log recorded it, compared with what the chart grants.

- No request was refused (the chart grants every verb the operator needs).
- Every permission the chart grants was used, but one: `update` on `rlruns/finalizers`, which
  no request names; the OwnerReferencesPermissionEnforcement admission plugin (on in the test
  API server) checks it whenever the operator writes a child whose owner reference blocks the
  owner's deletion, so without it every child would be refused.
"""

from __future__ import annotations

from rlrun.operator.rbac import REQUIRED_RULES, SECRET_RULES, permission_set
from rlrun.v1 import orchestrator_pb2

from .runs import NAME, RLRUN, all_pods_ready, call, get_run, no_pods, sample
from .test_kueue_cluster import QUEUE, quota

CHECKED_BY_ADMISSION = {("rlrun.dev", "rlruns/finalizers", "update")}


def used_permissions(events: list[dict]) -> tuple[set[tuple[str, str, str]], list[dict]]:
    """(group, resource[/subresource], verb) of each request, and the refused requests. A
    server-side apply that created its object (PATCH answered 201) needed `create` too."""
    used, refused = set(), []
    for event in events:
        ref = event.get("objectRef") or {}
        if "resource" not in ref:
            continue  # discovery and other non-resource requests
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        code = (event.get("responseStatus") or {}).get("code", 0)
        if code == 403:
            refused.append(event)
            continue
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and code == 201:
            used.add((ref.get("apiGroup", ""), resource, "create"))
    return used, refused


async def test_the_chart_grants_exactly_what_a_runs_life_uses(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually, operator_account
):
    quota(cluster, namespace, gpus=8)
    before = len(cluster.audit_events())
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    await call(kube.create, sample(namespace, queueName=QUEUE, ttlSecondsAfterFinished=1))
    await eventually(all_pods_ready(kube, namespace, 4), timeout=90, message="admitted and Ready")
    for replicas, count in ((2, 5), (1, 4)):  # a disruption budget created, then pruned
        await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"inference": {"replicas": replicas}}})
        await eventually(all_pods_ready(kube, namespace, count), timeout=90, message=f"{replicas} replicas")
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"suspend": True}})
    await eventually(no_pods(kube, namespace), timeout=60, message="suspended: no pods")
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"suspend": False}})
    await eventually(all_pods_ready(kube, namespace, 4), timeout=90, message="resumed")
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_SUCCEEDED, step=100, max_steps=100
    )
    await eventually(lambda: get_run(kube, namespace) is None, timeout=60, message="expired by its TTL")

    user = f"system:serviceaccount:rlrun-system:{operator_account}"
    events = [e for e in cluster.audit_events()[before:] if e["user"]["username"] == user]
    # Every request was about the run's namespace (the operator watches that one here).
    assert {
        (e.get("objectRef") or {}).get("namespace")
        for e in events
        if "resource" in (e.get("objectRef") or {})
    } == {namespace}
    used, refused = used_permissions(events)
    assert refused == [], [(e["verb"], e["objectRef"]) for e in refused]
    granted = permission_set(REQUIRED_RULES) | permission_set(SECRET_RULES)
    assert used <= granted, used - granted
    assert granted - used == CHECKED_BY_ADMISSION, granted - used
    # Not one read of a Secret.
    assert not [p for p in used if p[1] == "secrets" and p[2] in ("get", "list", "watch")]
