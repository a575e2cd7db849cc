"""Gang admission through Kueue, the pure part (what the operator renders): with spec.queueName
the pods whose count the run fixes are one Kueue pod group (label pod-group-name, annotations
pod-group-total-count = those pods and pod-group-serving, the queue label on the pods), the
inference replicas carry the queue label alone and are held at zero until Kueue admits the group,
and no workload object carries the queue label (Kueue's StatefulSet/Deployment integrations would
make each its own Workload). test_kueue_cluster.py checks the same against a real Kueue."""

from __future__ import annotations

import copy

import kubernetes_validate.utils
import pytest

from rlrun.operator.kueue import (
    ADMISSION_GATE,
    GROUP_NAME_LABEL,
    GROUP_SERVING_ANNOTATION,
    GROUP_TOTAL_ANNOTATION,
    QUEUE_LABEL,
    admission,
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


def expected_total(pool: int = 2, nodes: int = 2) -> int:
    # 2 model servers + pool + single env-server + default env-server + orchestrator + trainer
    return 2 + pool + 1 + 1 + 1 + nodes


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


def test_the_fixed_pods_of_a_queued_run_are_one_pod_group_and_inference_waits_for_it():
    for admitted in (False, True):
        state = desired_state(big_run(), gang_admitted=admitted)
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
        gang = [o for o in found if o["metadata"]["name"] != "gang-inference"]
        (inference,) = [o for o in found if o["metadata"]["name"] == "gang-inference"]
        assert expected_total() == 9 == sum(o["spec"]["replicas"] for o in gang)
        for obj in gang:
            assert group_keys(obj) == ("team-a-gpus", "gang-group", "9", "true"), obj["metadata"]["name"]
        # Inference: each replica a Workload of its own in the same queue, none until the gang is in.
        assert group_keys(inference) == ("team-a-gpus", None, None, None)
        assert inference["spec"]["replicas"] == (3 if admitted else 0)
        # The status still counts the replicas the run asks for.
        assert sum(w.replicas for w in state.workloads) == 12


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
    [({"pool": 4}, expected_total(pool=4)), ({"nodes": 4}, expected_total(nodes=4))],
)
def test_resizing_a_fixed_part_changes_the_total_on_every_gang_pod(change, total):
    found = [
        o for o in workloads(desired_state(big_run(**change))) if o["metadata"]["name"] != "gang-inference"
    ]
    assert sum(o["spec"]["replicas"] for o in found) == total
    assert {group_keys(o)[2] for o in found} == {str(total)}


def test_scaling_inference_changes_no_pod_template():
    """What lets a queued run scale inference without restarting its trainer: the inference
    count is in no pod template (it is not part of the pod group)."""
    before = workloads(desired_state(big_run(inference=3)))
    after = workloads(desired_state(big_run(inference=5)))
    for old, new in zip(before, after, strict=True):
        assert old["spec"]["template"] == new["spec"]["template"], old["metadata"]["name"]
        if old["metadata"]["name"] != "gang-inference":
            assert old == new
    assert [o["spec"]["replicas"] for o in after if o["metadata"]["name"] == "gang-inference"] == [5]


def pod(gated: bool) -> dict:
    gates = [{"name": ADMISSION_GATE}] if gated else []
    return {"metadata": {"name": "p"}, "spec": {"schedulingGates": gates}}


def workload(*conditions: tuple[str, str, str, str]) -> dict:
    return {
        "status": {
            "conditions": [
                {"type": kind, "status": status, "reason": reason, "message": message}
                for kind, status, reason, message in conditions
            ]
        }
    }


def test_admission_follows_kueues_workload_conditions():
    pending = workload(("QuotaReserved", "False", "Pending", "insufficient unused quota for nvidia.com/gpu"))
    assert admission(pending, [pod(True)]) == (
        admission(pending, [pod(True)]).__class__(
            False, "Pending", "insufficient unused quota for nvidia.com/gpu"
        )
    )
    admitted = workload(
        ("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", "ok")
    )
    assert admission(admitted, [pod(False)]).admitted
    evicted = workload(
        ("Admitted", "False", "NoReservation", ""), ("Evicted", "True", "Preempted", "by run b")
    )
    assert (admission(evicted, []).admitted, admission(evicted, []).reason) == (False, "Preempted")
    # No Workload: Kueue has not seen the group yet (gated pods, or no pods), or does not manage
    # the namespace at all (pods without its gate), in which case the run goes on without it.
    assert not admission(None, []).admitted
    assert not admission(None, [pod(True), pod(False)]).admitted
    assert admission(None, [pod(False)]).reason == "NotManagedByKueue"


def test_a_gang_of_more_pod_shapes_than_kueue_admits_is_refused_naming_the_queue():
    config = BASE_CONFIG + "".join(
        f'[[orchestrator.train.env]]\nid = "reverse-text"\nname = "e{i}"\n' for i in range(8)
    )
    servers = [
        {"name": f"s{i}", "envs": [f"e{i}"], "resources": {"requests": {"cpu": f"{i + 1}"}}} for i in range(8)
    ]
    state = desired_state(make_run(name="wide", config=config, envServers=servers, queueName="q"))
    assert state.error is not None and state.objects == []
    assert str(state.error).startswith("spec.queueName: the run's pods have 10 different shapes")
    # The same servers with one shape fit.
    for server in servers:
        server["resources"] = {"requests": {"cpu": "1"}}
    assert (
        desired_state(make_run(name="wide", config=config, envServers=servers, queueName="q")).error is None
    )


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
    found = [
        o
        for o in workloads(desired_state(run))
        if o["metadata"]["labels"]["app.kubernetes.io/component"] != "inference"
    ]
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
            found = [
                o
                for o in workloads(state)
                if o["metadata"]["labels"]["app.kubernetes.io/component"] != "inference"
            ]
            total = str(sum(o["spec"]["replicas"] for o in found))
            assert {group_keys(o)[2] for o in found} == {total}


def test_the_kueue_sample_is_one_group_and_its_inference():
    sample = load(REPO / "operator" / "samples" / "kueue-structured.yaml")
    sample["spec"]["suspend"] = False
    found = workloads(desired_state(copy.deepcopy(sample)))
    assert len(found) == 4
    keys = {o["metadata"]["labels"]["app.kubernetes.io/component"]: group_keys(o) for o in found}
    group = ("team-a-gpus", "structured-kueue-group", "3", "true")
    assert keys == {
        "inference": ("team-a-gpus", None, None, None),
        "env-server": group,
        "orchestrator": group,
        "trainer": group,
    }
    assert not any(QUEUE_LABEL in o["metadata"]["labels"] for o in found)
