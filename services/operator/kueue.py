"""Gang admission through Kueue: with `spec.queueName`, every pod of the run is one Kueue pod group.

Kueue's plain-pod integration (the `pod` framework) admits a group of pods as one Workload once
all of them exist: each pod carries

- label `kueue.x-k8s.io/queue-name`: the LocalQueue (the same on every pod of the group);
- label `kueue.x-k8s.io/pod-group-name`: the group, which is also the Workload's name;
- annotation `kueue.x-k8s.io/pod-group-total-count`: how many pods the group has;
- annotation `kueue.x-k8s.io/pod-group-serving: "true"`: the group never finishes by its pods
  succeeding (the run's pods are long-running, restarted in place under their StatefulSets and
  Deployments); Kueue admits replacement pods into the admitted group (a rolling update, a
  rescheduled pod) instead of treating a gone pod as done. Kueue v0.10.0 added this annotation.

Kueue gates each pod (scheduling gate `kueue.x-k8s.io/admission`) until the whole group has
quota, so a run is admitted all or nothing: no inference replica holds GPUs while the trainer
waits. Pods of different shapes become the Workload's pod sets (Kueue hashes each pod's spec).

The queue label goes on the pod templates only, never on the StatefulSets and Deployments:
Kueue's StatefulSet and Deployment integrations would otherwise make each workload object its own
Kueue Workload (admitted one by one), and a pod whose owner Kueue manages is left to that owner.
"""

from __future__ import annotations

from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
GROUP_SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
MIN_KUEUE_VERSION = "v0.10.0"
"""The first Kueue release with pod-group-serving (kubernetes-sigs/kueue#3684)."""

WORKLOAD_KINDS = ("StatefulSet", "Deployment")


def pod_group_total(objects: list[dict[str, Any]]) -> int:
    """Pods of every workload object among `objects` (the group's size)."""
    return sum(int(obj["spec"]["replicas"]) for obj in objects if obj["kind"] in WORKLOAD_KINDS)


def admit_as_gang(objects: list[dict[str, Any]], queue: str, group: str) -> None:
    """Stamps Kueue's pod-group metadata on the pod template of every workload in `objects`
    (in place), with the total of all their replicas; the workload objects themselves carry no
    Kueue label."""
    total = pod_group_total(objects)
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        obj["metadata"]["labels"].pop(QUEUE_LABEL, None)
        metadata = obj["spec"]["template"]["metadata"]
        metadata.setdefault("labels", {}).update({QUEUE_LABEL: queue, GROUP_NAME_LABEL: group})
        metadata.setdefault("annotations", {}).update(
            {GROUP_TOTAL_ANNOTATION: str(total), GROUP_SERVING_ANNOTATION: "true"}
        )
