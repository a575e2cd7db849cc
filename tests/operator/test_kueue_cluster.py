"""Gang admission with a real Kueue (its controller manager and webhooks, built from
sigs.k8s.io/kueue): a queued run that does not fit holds no GPU at all, is admitted whole once
quota frees up, and scales inference without restarting its trainer or orchestrator."""

from __future__ import annotations

import asyncio

from rlrun.operator.kueue import ADMISSION_GATE

from .runs import NAME, RLRUN, call, get_run, is_ready, pods, sample

QUEUE = "team-a-gpus"


def quota(cluster, namespace: str, gpus: int) -> str:
    """A ClusterQueue for the test's namespace with `gpus` GPUs (CPU and memory to spare), and
    the LocalQueue the run names; returns the ClusterQueue's name."""
    name = f"cq-{namespace}"
    cluster.apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "default-flavor"},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "default-flavor",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": 1000},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": QUEUE, "namespace": namespace},
                "spec": {"clusterQueue": name},
            },
        ]
    )
    return name


def gated(pod: dict) -> bool:
    return any(g["name"] == ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or [])


def by_component(found: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for pod in found:
        out.setdefault(pod["metadata"]["labels"]["app.kubernetes.io/component"], []).append(pod)
    return out


def admitted_condition(run: dict) -> dict:
    return next((c for c in run.get("status", {}).get("conditions", []) if c["type"] == "Admitted"), {})


async def test_a_queued_run_holds_no_gpu_until_it_fits_then_is_admitted_whole_and_scales_inference(
    cluster, namespace, kube, run_operator, orchestrator_stub, eventually
):
    cluster_queue = quota(cluster, namespace, gpus=4)
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    # The gang (trainer 8 GPUs, orchestrator, env-server) needs more GPUs than the queue has.
    run = sample(
        namespace,
        queueName=QUEUE,
        trainer={"nodes": 1, "gpusPerNode": 8},
        inference={"replicas": 2, "gpusPerReplica": 1},
    )
    await call(kube.create, run)

    def waiting():
        found = by_component(pods(kube, namespace))
        gang = [p for c in ("trainer", "orchestrator", "env-server") for p in found.get(c, [])]
        assert len(gang) == 3 and all(gated(p) and not p["spec"].get("nodeName") for p in gang), found
        run = get_run(kube, namespace)
        condition = admitted_condition(run)
        assert condition.get("status") == "False" and "nvidia.com/gpu" in condition.get("message", ""), (
            condition
        )
        return found, run

    found, run = await eventually(
        waiting, timeout=60, message="the gang gated by Kueue, the run not admitted"
    )
    # Nothing holds a GPU: no inference replica exists yet and no gang pod is bound.
    assert "inference" not in found
    inference = await call(kube.get, "apps/v1", "StatefulSet", namespace, f"{NAME}-inference")
    assert inference["spec"]["replicas"] == 0
    usage = await asyncio.to_thread(cluster.get_json, "clusterqueue", cluster_queue)
    assert (
        usage["status"].get("reservingWorkloads", 0) == 0 and usage["status"].get("admittedWorkloads", 0) == 0
    )
    assert "waiting for Kueue to admit the run" in run["status"]["message"]
    await asyncio.sleep(3)
    assert not [p for p in pods(kube, namespace) if p["spec"].get("nodeName")]

    # Quota frees up: the gang is admitted whole, then the inference replicas, one Workload each.
    await asyncio.to_thread(
        cluster.kubectl,
        "patch",
        "clusterqueue",
        cluster_queue,
        "--type=json",
        "-p",
        '[{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota", "value": 16}]',
    )

    def all_running(count):
        def check():
            found = pods(kube, namespace)
            ready = [p for p in found if is_ready(p) and not gated(p)]
            assert len(found) == count and len(ready) == count, [
                (p["metadata"]["name"], gated(p)) for p in found
            ]
            return found

        return check

    found = await eventually(all_running(5), timeout=90, message="the gang and 2 inference replicas Running")
    run = await call(get_run, kube, namespace)
    assert admitted_condition(run)["status"] == "True"
    workloads = (await asyncio.to_thread(cluster.get_json, "workloads", "-n", namespace))["items"]
    gang = [w for w in workloads if w["metadata"]["name"] == f"{NAME}-group"]
    assert len(gang) == 1 and sum(p["count"] for p in gang[0]["spec"]["podSets"]) == 3
    assert len(workloads) == 3  # the gang and one per inference replica
    gang_uid = gang[0]["metadata"]["uid"]
    kept = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in found
        if not p["metadata"]["name"].startswith(f"{NAME}-inference")
    }

    # Scale inference: one more replica, one more Workload; the trainer, orchestrator and
    # env-server pods and the gang's Workload stay as they are.
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"inference": {"replicas": 3}}})
    found = await eventually(all_running(6), timeout=90, message="a third inference replica Running")
    assert {
        n: u for n, u in ((p["metadata"]["name"], p["metadata"]["uid"]) for p in found) if n in kept
    } == kept
    workloads = (await asyncio.to_thread(cluster.get_json, "workloads", "-n", namespace))["items"]
    assert len(workloads) == 4
    assert [w["metadata"]["uid"] for w in workloads if w["metadata"]["name"] == f"{NAME}-group"] == [gang_uid]
