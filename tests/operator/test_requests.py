"""What the operator asks of the real API server for one run, from the audit log: the figures
`rlrun bench operator-scale` measures at scale, held here as counts for a single run."""

from __future__ import annotations

from collections import Counter

from rlrun.operator.kube import PLURALS
from rlrun.operator.reconcile import OWNED_KINDS

from .runs import KEPT, WORKLOADS, all_pods_ready, call, sample


def child_calls(events: list[dict], user: str, namespace: str, verb: str) -> Counter[str]:
    """How many `verb` requests the operator made on each child (resource/name), the Secret
    aside: it is applied on every pass, unread (the operator may not read Secrets)."""
    return Counter(
        f"{ref['resource']}/{ref.get('name', '')}"
        for event in events
        if event["user"]["username"] == user
        and event["verb"] == verb
        and event.get("stage") == "ResponseComplete"
        and (ref := event.get("objectRef") or {}).get("namespace") == namespace
        and ref.get("resource") not in ("secrets", "rlruns")
    )


async def test_a_new_run_applies_each_child_once_and_reads_them_a_list_per_kind(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually, operator_account
):
    """kopf runs the status timer beside the create handler; two passes of a new run would each
    find its children missing and apply every one of them twice (seen in the scale bench: two
    passes per new run, each child created by one and re-applied by the other). Each pass reads
    the run's objects with one list per kind, never a GET per object (which made a pass of the
    sample 22 requests instead of 9)."""
    user = f"system:serviceaccount:rlrun-system:{operator_account}"
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    before = len(await call(cluster.audit_events))
    await call(kube.create, sample(namespace))
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="4 pods Ready")
    polled = orchestrator_stub.calls
    await eventually(lambda: orchestrator_stub.calls >= polled + 3, message="three more status passes")
    events = (await call(cluster.audit_events))[before:]
    applies = child_calls(events, user, namespace, "patch")
    expected = {f"{PLURALS[api_version, kind]}/{name}" for api_version, kind, name in WORKLOADS | KEPT}
    assert set(applies) >= expected
    assert {child: count for child, count in applies.items() if count != 1} == {}
    assert child_calls(events, user, namespace, "get") == Counter()
    # (The namespace's Events are listed too while a pod is Pending: the pods' only word on a
    # volume or sandbox that fails.)
    # Up to the last pass's list of pods (what the status reads after the apply): the log may
    # end in the middle of a pass, and passes of one run never overlap.
    last = max(i for i, event in enumerate(events) if child_calls([event], user, namespace, "list")["pods/"])
    lists = child_calls(events[: last + 1], user, namespace, "list")
    del lists["events/"]
    passes = lists["configmaps/"]
    assert passes >= 4  # the create pass and at least three status passes
    listed = [PLURALS[kind] for kind in OWNED_KINDS] + ["pods"]  # (the pods: the status's)
    assert lists == Counter({f"{resource}/": passes for resource in listed})
