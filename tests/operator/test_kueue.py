"""Gang admission through Kueue (issue 32 item 4): with spec.queueName every pod of the run is
one Kueue pod group (label pod-group-name, annotations pod-group-total-count = all pods of the run
and pod-group-serving, the queue label on the pods) and no workload object carries the queue label
(Kueue's StatefulSet/Deployment integrations would make each its own Workload)."""

from __future__ import annotations

import copy

import kubernetes_validate.utils
import pytest

from rlrun.operator.kueue import (
    GROUP_NAME_LABEL,
    GROUP_SERVING_ANNOTATION,
    GROUP_TOTAL_ANNOTATION,
    QUEUE_LABEL,
)
from rlrun.operator.reconcile import desired_state
from tests.operator.test_reconcile import BASE_CONFIG, K8S_VERSIONS, REPO, SAMPLES, load, make_run

WORKLOAD_KINDS = ("StatefulSet", "Deployment")
CONFIG = (
    BASE_CONFIG
    + '[[orchestrator.train.env]]\nid = "reverse-text"\nname = "second"\n'
    + '[[orchestrator.train.env]]\nid = "reverse-text"\nname = "third"\n'
    + '[orchestrator.models.reference]\ncheckpoint = "/data/ref"\n'
    + '[orchestrator.models.critic]\ncheckpoint = "/data/critic"\n'
)


def big_run(queue: str | None = "team-a-gpus", inference: int = 3, pool: int = 2, nodes: int = 2, **spec):
    """A 2-node trainer, several inference replicas, two fixed model servers, an env-server pool of
    `pool` replicas, a one-replica env-server and the default env-server, and the orchestrator."""
    body = {
        "inference": {"replicas": inference, "gpusPerReplica": 1},
        "trainer": {"nodes": nodes, "gpusPerNode": 4},
        "storage": {"size": "10Gi", "accessModes": ["ReadWriteMany"]},
        "envServers": [
            {"name": "pool", "envs": ["second"], "replicas": pool},
            {"name": "single", "envs": ["third"]},
        ],
        **spec,
    }
    if queue is not None:
        body["queueName"] = queue
    return make_run(name="gang", config=CONFIG, **body)


def expected_total(inference: int = 3, pool: int = 2, nodes: int = 2) -> int:
    # inference + 2 model servers + pool + single env-server + default env-server + orchestrator + trainer
    return inference + 2 + pool + 1 + 1 + 1 + nodes


def workloads(state) -> list[dict]:
    assert state.error is None, state.error
    return [o for o in state.objects if o["kind"] in WORKLOAD_KINDS]


def group_keys(obj: dict) -> tuple:
    meta = obj["spec"]["template"]["metadata"]
    labels, annotations = meta.get("labels", {}), meta.get("annotations", {})
    return (
        labels.get(QUEUE_LABEL),
        labels.get(GROUP_NAME_LABEL),
        annotations.get(GROUP_TOTAL_ANNOTATION),
        annotations.get(GROUP_SERVING_ANNOTATION),
    )


def test_every_pod_of_a_queued_run_is_one_pod_group_with_the_total_of_all_its_pods():
    state = desired_state(big_run())
    found = workloads(state)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in found)
    assert kinds == [
        ("Deployment", "gang-env"),
        ("Deployment", "gang-env-pool"),
        ("Deployment", "gang-env-single"),
        ("Deployment", "gang-orchestrator"),
        ("StatefulSet", "gang-inference"),
        ("StatefulSet", "gang-model-critic"),
        ("StatefulSet", "gang-model-reference"),
        ("StatefulSet", "gang-trainer"),
    ]
    total = expected_total()
    assert total == 12 == sum(o["spec"]["replicas"] for o in found)
    for obj in found:
        assert group_keys(obj) == ("team-a-gpus", "gang-group", "12", "true"), obj["metadata"]["name"]
    assert sum(w.replicas for w in state.workloads) == total


def test_no_object_but_the_pod_templates_carries_a_kueue_key():
    state = desired_state(big_run())
    for obj in state.objects:
        assert not [k for k in obj["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")], obj["kind"]
        assert "annotations" not in obj["metadata"]
        if obj["kind"] in WORKLOAD_KINDS:
            # The selector must not change with the queue (a selector is immutable).
            assert not [k for k in obj["spec"]["selector"]["matchLabels"] if k.startswith("kueue.x-k8s.io/")]


@pytest.mark.parametrize(
    ("change", "total"),
    [
        ({"inference": 5}, expected_total(inference=5)),
        ({"pool": 4}, expected_total(pool=4)),
        ({"nodes": 4}, expected_total(nodes=4)),
        ({"inference": 1, "pool": 1, "nodes": 1}, expected_total(1, 1, 1)),
    ],
)
def test_scaling_changes_the_total_on_every_pod(change, total):
    found = workloads(desired_state(big_run(**change)))
    assert sum(o["spec"]["replicas"] for o in found) == total
    assert {group_keys(o)[2] for o in found} == {str(total)}


def test_without_a_queue_or_without_pods_no_kueue_key_anywhere():
    for state in (
        desired_state(big_run(queue=None)),
        desired_state(big_run(suspend=True)),
        desired_state(big_run(), finished=True),
    ):
        assert state.error is None
        assert "kueue.x-k8s.io/" not in str(state.objects)


def test_the_group_keys_survive_a_pod_template_override_and_a_long_run_name():
    run = big_run(
        trainer={
            "nodes": 2,
            "gpusPerNode": 4,
            "podTemplate": {"metadata": {"labels": {"team": "a"}, "annotations": None}},
        }
    )
    run["metadata"]["name"] = "r" * 40
    found = workloads(desired_state(run))
    group = {group_keys(o)[1] for o in found}
    (name,) = group
    assert len(name) <= 63
    assert {group_keys(o)[2:] for o in found} == {(str(expected_total()), "true")}


@pytest.mark.parametrize("queued", [True, False])
def test_queued_runs_render_valid_objects(queued):
    runs = [big_run(queue="team-a-gpus" if queued else None)]
    for path in SAMPLES:
        run = load(path)
        run["spec"]["suspend"] = False
        if queued:
            run["spec"]["queueName"] = "q"
        runs.append(run)
    for run in runs:
        state = desired_state(run)
        assert state.error is None, state.error
        for obj in state.objects:
            for version in K8S_VERSIONS:
                kubernetes_validate.utils.validate(obj, version, strict=True)
        if queued:
            found = workloads(state)
            total = str(sum(o["spec"]["replicas"] for o in found))
            assert {group_keys(o)[2] for o in found} == {total}


def test_the_kueue_sample_is_one_group():
    sample = load(REPO / "operator" / "samples" / "kueue-structured.yaml")
    sample["spec"]["suspend"] = False
    found = workloads(desired_state(copy.deepcopy(sample)))
    assert len(found) == 4
    assert {group_keys(o) for o in found} == {("team-a-gpus", "structured-kueue-group", "4", "true")}
    assert not any(QUEUE_LABEL in o["metadata"]["labels"] for o in found)
