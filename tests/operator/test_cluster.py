"""What a cluster user depends on, against the real control plane: server-side apply beside other
field managers, the garbage collector, the scheduler placing GPU pods on GPU nodes, why a pod does
not run, restarts, scaling, a deleted pod, a drained node, and Secrets outside runNamespaces.

Every workload controller, the scheduler and the garbage collector are Kubernetes' own; the
pods are kwok's (Running and Ready as soon as they are bound; a test that needs a kubelet's
report of restarts writes it into a real pod's status, as a kubelet would, after telling kwok
to leave that pod's status alone)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from kubecluster.provisioner import storage_class

from rlrun.operator.kube import FIELD_MANAGER

from .conftest import REPO
from .runs import (
    KEPT,
    NAME,
    RLRUN,
    WORKLOADS,
    all_pods_ready,
    call,
    conditions,
    events,
    get_run,
    has,
    is_ready,
    pods,
    present,
    sample,
)

SAMPLES = REPO / "operator" / "samples"
CUSTOM_STATUS = {"kwok.x-k8s.io/status": "custom"}
"""kwok leaves the status of a pod with this annotation to whoever writes it (kwok's
--disregard-status-with-annotation-selector, which kubecluster sets)."""


async def start(run_operator, orchestrator_stub, **options):
    return await run_operator(
        status_interval_s=0.5,
        status_timeout_s=1.0,
        status_address=f"127.0.0.1:{orchestrator_stub.port}",
        **options,
    )


def condition(run: dict, kind: str) -> dict:
    return next(c for c in run["status"]["conditions"] if c["type"] == kind)


def pod_named(kube, namespace: str, name: str) -> dict | None:
    return kube.get("v1", "Pod", namespace, name)


async def test_server_side_apply_keeps_what_others_own_and_reverts_what_the_operator_owns(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    await start(run_operator, orchestrator_stub)
    await call(kube.create, sample(namespace))
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="children created")
    trainer, orchestrator = f"{NAME}-trainer", f"{NAME}-orchestrator"

    # Another manager (a user's kubectl) changes a field the operator sets, adds a label, and
    # sets a field the operator never sets.
    await asyncio.to_thread(
        cluster.kubectl, "-n", namespace, "set", "image", f"deployment/{orchestrator}", "orchestrator=evil:1"
    )
    await asyncio.to_thread(
        cluster.kubectl, "-n", namespace, "label", f"statefulset/{trainer}", "team=research"
    )
    await asyncio.to_thread(
        cluster.kubectl, "-n", namespace, "annotate", f"deployment/{orchestrator}", "example.com/owner=alice"
    )

    def reverted():
        deployment = kube.get("apps/v1", "Deployment", namespace, orchestrator)
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        return image != "evil:1" and deployment

    deployment = await eventually(reverted, message="the operator's image is back")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].startswith("ghcr.io/rlrun/")
    # What the other manager owns and the operator does not stays, in the API server's own
    # managedFields.
    assert deployment["metadata"]["annotations"]["example.com/owner"] == "alice"
    stateful_set = await call(kube.get, "apps/v1", "StatefulSet", namespace, trainer)
    assert stateful_set["metadata"]["labels"]["team"] == "research"
    managers = {m["manager"] for m in stateful_set["metadata"]["managedFields"]}
    assert {"rlrun-operator/trainer", "kubectl-label"} <= managers
    await asyncio.sleep(2)  # a few more status passes: nobody takes the label away
    stateful_set = await call(kube.get, "apps/v1", "StatefulSet", namespace, trainer)
    assert stateful_set["metadata"]["labels"]["team"] == "research"


async def test_fields_removed_from_the_run_leave_its_workloads(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    """A nodeSelector, a toleration and a priorityClassName taken out of the RLRun are taken out
    of every workload (the API server's server-side apply removes the fields a manager no
    longer applies; a merge patch would leave them)."""
    cluster.apply(
        [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "research-high"},
                "value": 1000,
            }
        ]
    )
    await start(run_operator, orchestrator_stub)
    toleration = {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}
    placement = {"nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [toleration]}
    await call(kube.create, sample(namespace, placement=placement, priorityClassName="research-high"))

    def workloads():
        found = [kube.get(api_version, kind, namespace, name) for api_version, kind, name in WORKLOADS]
        return found if all(found) else None

    def placed(obj):
        spec = obj["spec"]["template"]["spec"]
        return (
            spec.get("nodeSelector"),
            toleration in (spec.get("tolerations") or []),
            spec.get("priorityClassName"),
        )

    def all_placed(expected):
        return lambda: (found := workloads()) is not None and all(placed(obj) == expected for obj in found)

    await eventually(all_placed(({"kubernetes.io/os": "linux"}, True, "research-high")), message="placed")
    # The pods carry it too: the PriorityClass admission resolved the priority.
    found = await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="pods Ready")
    assert {p["spec"]["priority"] for p in found} == {1000}
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"placement": None, "priorityClassName": None}})
    await eventually(all_placed((None, False, None)), message="removed fields left every workload")


async def test_deleting_a_run_garbage_collects_its_children_through_owner_references(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    """Without the operator's cleanup (it is stopped, and the finalizer is released by hand):
    the API server's garbage collector alone deletes every child and, through the workloads,
    every pod."""
    operator = await start(run_operator, orchestrator_stub)
    await call(kube.create, sample(namespace))
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="children created")
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="pods Ready")
    assert await call(kube.get, "v1", "Secret", namespace, f"{NAME}-auth")
    await operator.stop()
    await asyncio.to_thread(
        cluster.kubectl,
        "-n",
        namespace,
        "patch",
        "rlrun",
        NAME,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )
    await call(kube.delete, *RLRUN, namespace, NAME)
    await eventually(lambda: present(kube, namespace) == set(), timeout=60, message="children collected")
    await eventually(lambda: not pods(kube, namespace), timeout=60, message="pods collected")
    assert await call(kube.get, "v1", "Secret", namespace, f"{NAME}-auth") is None
    assert await call(kube.get, "networking.k8s.io/v1", "NetworkPolicy", namespace, f"{NAME}-network") is None


def gpu_sample(namespace: str) -> dict:
    run = yaml.safe_load((SAMPLES / "multinode-vllm.yaml").read_text())
    run["metadata"]["namespace"] = namespace
    return run


async def test_every_kwok_node_heartbeats_on_its_lease(cluster, eventually):
    """As a kubelet does. Without it, every node went NotReady once the node monitor's grace
    period (60 s) had passed, and the node controller marked every pod on it not Ready, which
    kwok never undid: the runs of `rlrun bench operator-scale` never became ready."""
    nodes = [n["metadata"]["name"] for n in (await asyncio.to_thread(cluster.get_json, "nodes"))["items"]]

    def renewals() -> dict[str, str]:
        leases = cluster.get_json("leases", "-n", "kube-node-lease")["items"]
        return {lease["metadata"]["name"]: lease["spec"].get("renewTime") for lease in leases}

    first = await asyncio.to_thread(renewals)
    assert set(first) >= set(nodes), f"nodes without a Lease: {set(nodes) - set(first)}"
    await eventually(
        lambda: all(renewals()[node] > first[node] for node in nodes),
        timeout=30,
        message="every node's Lease renewed (kwok renews it every 10 s)",
    )


async def test_gpu_pods_land_on_gpu_nodes_and_cpu_pods_elsewhere(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    """The multi-node vLLM sample as it ships: 4 inference replicas of 2 GPUs, a 2-node trainer
    of 8 GPUs each (one per node: anti-affinity), by the GPU product label, with a toleration
    for a `dedicated` taint, spread over zones; what the sample expects to exist first (its
    PriorityClass, its StorageClass and the claim with the weights) is created as a cluster
    admin would."""
    cluster.apply(
        [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "research-high"},
                "value": 1000,
            },
            storage_class("shared-nfs", default=False),
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "models", "namespace": namespace},
                "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "100Gi"}}},
            },
        ]
    )
    await start(run_operator, orchestrator_stub)
    run = gpu_sample(namespace)
    name = run["metadata"]["name"]
    await call(kube.create, run)
    expected = 4 + 2 + 2 + 1  # inference, trainer nodes, env-server replicas, orchestrator
    found = await eventually(
        all_pods_ready(kube, namespace, expected, name), timeout=90, message="every pod Ready"
    )
    nodes = {n["metadata"]["name"]: n for n in (await asyncio.to_thread(cluster.get_json, "nodes"))["items"]}
    by_component: dict[str, list[dict]] = {}
    for pod in found:
        by_component.setdefault(pod["metadata"]["labels"]["app.kubernetes.io/component"], []).append(pod)
    for component in ("inference", "trainer"):
        for pod in by_component[component]:
            node = nodes[pod["spec"]["nodeName"]]
            assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", pod[
                "metadata"
            ]["name"]
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
                "tolerations"
            ]
    for component in ("orchestrator", "env-server"):
        for pod in by_component[component]:
            assert "nvidia.com/gpu.present" not in nodes[pod["spec"]["nodeName"]]["metadata"]["labels"]
    # One trainer pod per node, and the 4 inference replicas over both zones.
    assert len({p["spec"]["nodeName"] for p in by_component["trainer"]}) == 2
    zones = [
        nodes[p["spec"]["nodeName"]]["metadata"]["labels"]["topology.kubernetes.io/zone"]
        for p in by_component["inference"]
    ]
    assert sorted(zones) == ["zone-a", "zone-a", "zone-b", "zone-b"]
    # The status sees every workload ready. Each condition follows its StatefulSet's
    # readyReplicas, which the controller-manager updates on its own after the pods turn Ready,
    # so the two are waited for together rather than one read after the other.
    await eventually(
        lambda: (
            (r := get_run(kube, namespace, name))
            and {conditions(r).get("InferenceReady"), conditions(r).get("TrainerReady")} == {"True"}
        ),
        timeout=30,
        message="InferenceReady and TrainerReady",
    )


async def test_why_a_pod_does_not_run_comes_from_the_scheduler_and_the_kubelet(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    await start(run_operator, orchestrator_stub)
    # 16 GPUs per replica: no node has that many, and the real scheduler says so.
    await call(kube.create, sample(namespace, inference={"replicas": 1, "gpusPerReplica": 16}))

    def explained():
        run = get_run(kube, namespace)
        found = {c["type"]: c for c in (run or {}).get("status", {}).get("conditions", [])}
        return found.get("InferenceReady", {}).get("reason") == "Unschedulable" and found

    found = await eventually(explained, timeout=60, message="InferenceReady says Unschedulable")
    assert "Insufficient nvidia.com/gpu" in found["InferenceReady"]["message"]
    assert "0/6 nodes are available" in found["InferenceReady"]["message"]

    # A kubelet's report of a crash-looping trainer (OOM-killed), written into the real pod.
    trainer = f"{NAME}-trainer-0"
    await eventually(
        lambda: (pod := pod_named(kube, namespace, trainer)) and is_ready(pod),
        timeout=60,
        message="trainer Ready",
    )
    await asyncio.to_thread(
        cluster.kubectl, "-n", namespace, "annotate", "pod", trainer, "kwok.x-k8s.io/status=custom"
    )
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "x",
                "imageID": "",
                "ready": False,
                "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                "lastState": {
                    "terminated": {
                        "reason": "OOMKilled",
                        "exitCode": 137,
                        "finishedAt": "2026-01-01T12:00:00Z",
                    }
                },
            }
        ],
    }
    await call(kube.patch, "v1", "Pod", namespace, trainer, {"status": status}, "status")

    def crash_loop():
        run = get_run(kube, namespace)
        found = {c["type"]: c for c in run["status"]["conditions"]}
        return found["TrainerReady"]["reason"] == "CrashLoopBackOff" and run

    run = await eventually(crash_loop, timeout=30, message="TrainerReady says CrashLoopBackOff")
    assert "keeps exiting (last: OOMKilled, exit code 137)" in condition(run, "TrainerReady")["message"]
    assert run["status"]["restarts"]["trainer"] == 5
    restarted = condition(run, "Restarted")
    assert restarted["status"] == "True" and f"{trainer}: OOMKilled" in restarted["message"]
    await eventually(
        lambda: [e for e in events(kube, namespace) if e.get("reason") == "Restarted"],
        message="a Restarted event",
    )


def operator_written(obj: dict) -> tuple:
    """What the operator's writes leave on a workload: its spec's generation and the operator's
    own managedFields entries. Not the resourceVersion: the controller-manager's status updates
    (readyReplicas, observedGeneration) bump that on their own after the pods turn Ready."""
    mine = [
        (m["manager"], m["operation"], m.get("time"), json.dumps(m.get("fieldsV1"), sort_keys=True))
        for m in obj["metadata"].get("managedFields", [])
        if m["manager"].startswith(FIELD_MANAGER) and m.get("subresource") != "status"
    ]
    assert mine, obj["metadata"].get("managedFields")
    return obj["metadata"]["generation"], sorted(mine)


async def test_scaling_inference_restarts_no_other_pod(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    await start(run_operator, orchestrator_stub)
    await call(kube.create, sample(namespace))
    before = await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="pods Ready")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
    versions = {
        name: operator_written(await call(kube.get, api_version, kind, namespace, name))
        for api_version, kind, name in WORKLOADS
        if not name.endswith("-inference")
    }
    assert await call(kube.get, "policy/v1", "PodDisruptionBudget", namespace, f"{NAME}-inference") is None

    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"inference": {"replicas": 2}}})
    after = await eventually(all_pods_ready(kube, namespace, 5), timeout=60, message="a second replica Ready")
    # Every pod that was there is the same pod (nothing restarted), the non-inference workloads
    # were not even written, and the run file lists the new replica.
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == uids | {
        f"{NAME}-inference-1": next(
            p["metadata"]["uid"] for p in after if p["metadata"]["name"] == f"{NAME}-inference-1"
        )
    }
    for api_version, kind, name in WORKLOADS:
        if name in versions:
            assert (
                operator_written(await call(kube.get, api_version, kind, namespace, name)) == versions[name]
            )
    config = (await call(kube.get, "v1", "ConfigMap", namespace, f"{NAME}-config"))["data"]["config.toml"]
    assert f"{NAME}-inference-1.{NAME}-inference.{namespace}.svc.cluster.local:50051" in config
    budget = await call(kube.get, "policy/v1", "PodDisruptionBudget", namespace, f"{NAME}-inference")
    assert budget["spec"]["maxUnavailable"] == 1
    # The disruption controller sees both replicas healthy.
    await eventually(
        lambda: (
            (b := kube.get("policy/v1", "PodDisruptionBudget", namespace, f"{NAME}-inference"))
            and b.get("status", {}).get("currentHealthy") == 2
        ),
        timeout=30,
        message="the budget counts 2 healthy pods",
    )
    # Back to one replica: the budget goes, the second pod with it.
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"inference": {"replicas": 1}}})
    await eventually(
        lambda: kube.get("policy/v1", "PodDisruptionBudget", namespace, f"{NAME}-inference") is None,
        message="budget pruned",
    )
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="back to 4 pods")


async def test_a_deleted_pod_comes_back_and_the_status_follows(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    """docs/resilience.md: a pod that goes (deleted, evicted) is replaced by its workload's
    controller, and the run's conditions say when a component is not ready meanwhile."""
    await start(run_operator, orchestrator_stub)
    await call(kube.create, sample(namespace))
    before = await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="pods Ready")
    await eventually(
        lambda: conditions(get_run(kube, namespace)).get("TrainerReady") == "True",
        timeout=30,
        message="TrainerReady",
    )
    old = next(p for p in before if p["metadata"]["name"] == f"{NAME}-trainer-0")
    await call(kube.delete, "v1", "Pod", namespace, old["metadata"]["name"])

    def replaced():
        pod = pod_named(kube, namespace, f"{NAME}-trainer-0")
        return pod and pod["metadata"]["uid"] != old["metadata"]["uid"] and is_ready(pod) and pod

    await eventually(replaced, timeout=60, message="the StatefulSet controller replaced the trainer pod")
    run = await eventually(
        lambda: (r := get_run(kube, namespace)) and conditions(r).get("TrainerReady") == "True" and r,
        timeout=30,
        message="TrainerReady again",
    )
    # A new pod is not a restart: no container restarted.
    assert (run["status"].get("restarts") or {}).get("trainer", 0) == 0


async def test_draining_a_node_moves_inference_one_replica_at_a_time(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    """`kubectl drain` of the node of an inference replica: eviction goes through the run's
    PodDisruptionBudget (one replica at a time), the StatefulSet controller recreates the pod and
    the scheduler puts it on another GPU node."""
    await start(run_operator, orchestrator_stub)
    await call(kube.create, sample(namespace, inference={"replicas": 2, "gpusPerReplica": 1}))
    found = await eventually(all_pods_ready(kube, namespace, 5), timeout=60, message="pods Ready")
    victim = next(p for p in found if p["metadata"]["name"] == f"{NAME}-inference-0")
    node = victim["spec"]["nodeName"]
    assert node.startswith("gpu-node-")
    try:
        await asyncio.to_thread(
            cluster.kubectl,
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
            timeout=120,
        )

        def moved():
            pod = pod_named(kube, namespace, f"{NAME}-inference-0")
            return (
                pod
                and pod["metadata"]["uid"] != victim["metadata"]["uid"]
                and pod["spec"].get("nodeName") not in (None, node)
                and is_ready(pod)
                and pod
            )

        pod = await eventually(moved, timeout=90, message="inference-0 rescheduled on another node")
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        evictions = [
            e
            for e in cluster.audit_events()
            if (e.get("objectRef") or {}).get("subresource") == "eviction"
            and (e.get("objectRef") or {}).get("namespace") == namespace
        ]
        assert evictions and all(e["responseStatus"]["code"] in (201, 429) for e in evictions)
    finally:
        await asyncio.to_thread(cluster.kubectl, "uncordon", node)


async def test_a_run_outside_the_charts_run_namespaces_gets_no_secret_and_says_why(
    cluster, unlisted_namespace, kube, run_operator, orchestrator_stub, eventually, operator_account
):
    """The operator may write Secrets only where the chart's operator.runNamespaces lets it (a
    Role there); elsewhere the API server refuses, and the run's status names the value to set."""
    namespace = unlisted_namespace
    user = f"system:serviceaccount:rlrun-system:{operator_account}"
    for where, allowed in (("kube-system", "no"), (namespace, "no"), ("default", "yes")):
        answer = await asyncio.to_thread(
            cluster.kubectl, "auth", "can-i", "create", "secrets", "-n", where, f"--as={user}", check=False
        )
        assert answer.stdout.strip() == allowed, where
    # ... though it manages every other kind of child in any namespace (watchAllNamespaces).
    answer = await asyncio.to_thread(
        cluster.kubectl, "auth", "can-i", "create", "statefulsets", "-n", namespace, f"--as={user}"
    )
    assert answer.stdout.strip() == "yes"

    await start(run_operator, orchestrator_stub, watch=[namespace])
    await call(kube.create, sample(namespace))

    def degraded():
        run = get_run(kube, namespace)
        found = {c["type"]: c for c in (run or {}).get("status", {}).get("conditions", [])}
        assert found.get("Degraded", {}).get("reason") == "ApplyFailed", found.get("Degraded")
        return found["Degraded"]

    found = await eventually(degraded, timeout=30, message="Degraded: ApplyFailed")
    assert f'secrets "{NAME}-auth" is forbidden' in found["message"]
    assert "operator.runNamespaces" in found["message"]
    assert await call(kube.get, "v1", "Secret", namespace, f"{NAME}-auth") is None


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_sample_is_accepted_by_the_api_server(cluster, namespace, path):
    run = yaml.safe_load(path.read_text())
    run["metadata"]["namespace"] = namespace
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(run))
    assert "created (server dry run)" in result.stdout
