"""Gang admission through Kueue: with `spec.queueName`, a run is admitted by Kueue before any of
its GPUs are held, and its inference can still be scaled without restarting anything.

Kueue's plain-pod integration (the `pod` framework) admits a group of pods as one Workload once
all of them exist and the ClusterQueue has quota for all of them. A pod joins a group with

- label `kueue.x-k8s.io/queue-name`: the LocalQueue (the same on every pod of the group);
- label `kueue.x-k8s.io/pod-group-name`: the group, which is also the Workload's name;
- annotation `kueue.x-k8s.io/pod-group-total-count`: how many pods the group has;
- annotation `kueue.x-k8s.io/pod-group-serving: "true"`: the group never finishes by its pods
  succeeding (the run's pods are long-running, restarted in place under their StatefulSets and
  Deployments); Kueue admits replacement pods into the admitted group (a rolling update, a
  rescheduled pod) instead of treating a gone pod as done. Kueue v0.10.0 added this annotation.

The group's size is part of every member's pod template, and Kueue (to v0.17 at least) cannot
resize a pod group or a StatefulSet it manages: a pod whose total differs from its group's is
refused, and its StatefulSet webhook forbids any resize but to and from zero. So a group that
held the inference replicas would make every inference scale-up roll every pod of the run (the
trainer and orchestrator restart from their checkpoint) and, while the pods roll, leave Kueue
with a group of two sizes it cannot admit. Hence two parts:

- **the gang**: every pod whose count the run fixes (trainer nodes, orchestrator, env-servers,
  fixed model servers), one pod group `<run>-group`, admitted all or nothing;
- **inference**, the part a run scales: each replica is a Workload of its own in the same
  LocalQueue (the queue label alone), and the inference StatefulSet is held at zero replicas
  until Kueue has admitted the gang. A run that does not fit holds no GPU at all; once the gang
  is admitted, its replicas are admitted one by one as quota allows; scaling inference creates or
  removes pods and changes no pod template.

The queue label goes on the pod templates only, never on the StatefulSets and Deployments:
Kueue's StatefulSet and Deployment integrations would otherwise make each workload object its own
Kueue Workload, and a pod whose owner Kueue manages is left to that owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
GROUP_SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate Kueue's pod webhook puts on every pod it manages, until admission."""
WORKLOAD_API = ("kueue.x-k8s.io/v1beta2", "Workload")
MIN_KUEUE_VERSION = "v0.10.0"
"""The first Kueue release with pod-group-serving (kubernetes-sigs/kueue#3684)."""
MAX_POD_SETS = 8
"""Kueue composes a pod group's Workload from at most this many distinct pod shapes (v0.17)."""

WORKLOAD_KINDS = ("StatefulSet", "Deployment")
COMPONENT_LABEL = "app.kubernetes.io/component"
ELASTIC_COMPONENTS = ("inference",)
"""Components outside the gang: their replicas are Workloads of their own (see above)."""


def _elastic(obj: dict[str, Any]) -> bool:
    return obj["metadata"]["labels"].get(COMPONENT_LABEL) in ELASTIC_COMPONENTS


def gang(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workload objects whose pods form the run's pod group."""
    return [obj for obj in objects if obj["kind"] in WORKLOAD_KINDS and not _elastic(obj)]


def _containers_shape(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"requests": (c.get("resources") or {}).get("requests"), "ports": c.get("ports")} for c in containers
    ]


def pod_shape(pod: dict[str, Any]) -> str:
    """What Kueue tells a pod group's pod sets apart by (its `GenerateRoleHash`: the containers'
    requests and ports, placement, priority, overhead and claims), as a comparable string."""
    import json

    shape = {
        "initContainers": _containers_shape(pod.get("initContainers") or []),
        "containers": _containers_shape(pod.get("containers") or []),
        **{
            key: pod.get(key)
            for key in (
                "nodeSelector",
                "affinity",
                "tolerations",
                "runtimeClassName",
                "priority",
                "topologySpreadConstraints",
                "overhead",
                "resourceClaims",
            )
        },
    }
    return json.dumps(shape, sort_keys=True)


def pod_sets(objects: list[dict[str, Any]]) -> int:
    """How many pod sets Kueue would make of the gang among `objects`."""
    return len({pod_shape(obj["spec"]["template"]["spec"]) for obj in gang(objects)})


def pod_group_total(objects: list[dict[str, Any]]) -> int:
    """Pods of the gang among `objects` (the group's size)."""
    return sum(int(obj["spec"]["replicas"]) for obj in gang(objects))


def queue_for_kueue(objects: list[dict[str, Any]], queue: str, group: str, admitted: bool) -> None:
    """Stamps Kueue's metadata on the pod templates of the workloads in `objects` (in place):
    the gang's carry the pod group, with the total of their replicas; the elastic components'
    the queue label alone, and their replicas stay at zero until the gang is `admitted`."""
    total = pod_group_total(objects)
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        obj["metadata"]["labels"].pop(QUEUE_LABEL, None)
        metadata = obj["spec"]["template"]["metadata"]
        labels = metadata.setdefault("labels", {})
        labels[QUEUE_LABEL] = queue
        if _elastic(obj):
            if not admitted:
                obj["spec"]["replicas"] = 0
            continue
        labels[GROUP_NAME_LABEL] = group
        metadata.setdefault("annotations", {}).update(
            {GROUP_TOTAL_ANNOTATION: str(total), GROUP_SERVING_ANNOTATION: "true"}
        )


@dataclass(frozen=True)
class Admission:
    """Whether Kueue admitted a queued run's gang, and what Kueue says about it."""

    admitted: bool
    reason: str
    message: str


def _gated(pod: dict[str, Any]) -> bool:
    return any(
        gate.get("name") == ADMISSION_GATE for gate in (pod.get("spec") or {}).get("schedulingGates") or []
    )


def admission(workload: dict[str, Any] | None, group_pods: list[dict[str, Any]]) -> Admission:
    """The gang's admission, from the Kueue Workload named after the pod group (None: there is
    none) and the group's live pods. Without a Workload, pods that Kueue did not gate mean that
    Kueue does not manage the namespace (or is not installed): the gang runs as it is."""
    if workload is None:
        if group_pods and not any(_gated(pod) for pod in group_pods):
            return Admission(True, "NotManagedByKueue", "the run's pods carry no Kueue admission gate")
        return Admission(False, "WorkloadPending", "waiting for Kueue to create the run's Workload")
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted") or {}
    if admitted.get("status") == "True":
        return Admission(True, "Admitted", str(admitted.get("message") or "admitted by Kueue"))
    if (conditions.get("Evicted") or {}).get("status") == "True":
        evicted = conditions["Evicted"]
        return Admission(False, str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or ""))
    pending = conditions.get("QuotaReserved") or admitted
    return Admission(
        False, str(pending.get("reason") or "Pending"), str(pending.get("message") or "waiting for quota")
    )
