"""The kopf operator end to end against the KMock API emulator and a stand-in orchestrator:
apply an RLRun -> children with owner references -> status from the orchestrator's GetStatus ->
suspend and resume -> the run finishes (pods go, storage stays) -> delete -> finalizer released.

The emulator serves from the test's event loop, so blocking client calls run in threads
(`call`, and `eventually` runs plain checks in a thread)."""

from __future__ import annotations

import asyncio
import base64
import copy
from pathlib import Path

import yaml

from rlrun.v1 import orchestrator_pb2

REPO = Path(__file__).resolve().parents[2]
SAMPLE = yaml.safe_load((REPO / "configs" / "k8s" / "rlrun.yaml").read_text())
NS = SAMPLE["metadata"]["namespace"]
NAME = SAMPLE["metadata"]["name"]
RLRUN = ("rlrun.dev/v1alpha1", "RLRun")
WORKLOADS = {
    ("apps/v1", "StatefulSet", f"{NAME}-inference"),
    ("apps/v1", "StatefulSet", f"{NAME}-trainer"),
    ("apps/v1", "Deployment", f"{NAME}-orchestrator"),
    ("apps/v1", "Deployment", f"{NAME}-env-reverse-text"),
}
KEPT = {
    ("v1", "ConfigMap", f"{NAME}-config"),
    ("v1", "PersistentVolumeClaim", f"{NAME}-checkpoints"),
    ("v1", "Service", f"{NAME}-inference"),
    ("v1", "Service", f"{NAME}-trainer"),
    ("v1", "Service", f"{NAME}-orchestrator"),
    ("v1", "Service", f"{NAME}-env-reverse-text"),
}
KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
)


async def call(fn, *args):
    return await asyncio.to_thread(fn, *args)


# Assertions read the emulator's stored objects directly (cheap, and on its own event loop);
# the operator under test goes through the HTTP API like any client.
KINDS = {
    "configmaps": ("v1", "ConfigMap"),
    "services": ("v1", "Service"),
    "persistentvolumeclaims": ("v1", "PersistentVolumeClaim"),
    "statefulsets": ("apps/v1", "StatefulSet"),
    "deployments": ("apps/v1", "Deployment"),
}


def stored(k8s, plural: str, name: str) -> dict | None:
    for (resource, namespace, key), obj in list(k8s.objects.items()):
        if resource.plural == plural and namespace == NS and key == name and not obj.deleted:
            return obj.raw
    return None


def present_in(k8s) -> set[tuple[str, str, str]]:
    return {
        (*KINDS[resource.plural], name)
        for (resource, namespace, name), obj in list(k8s.objects.items())
        if resource.plural in KINDS
        and namespace == NS
        and not obj.deleted
        and obj.raw["metadata"].get("labels", {}).get("rlrun.dev/run") == NAME
    }


def present(kube) -> set[tuple[str, str, str]]:
    """The same, through the API (blocking; run it in a thread)."""
    found = set()
    for api_version, kind in KINDS.values():
        found |= {
            (api_version, kind, o["metadata"]["name"])
            for o in kube.list(api_version, kind, NS, {"rlrun.dev/run": NAME})
        }
    return found


def get_run(kube):
    return kube.get(*RLRUN, NS, NAME)


def has(k8s, expected):
    async def check():
        return present_in(k8s) == expected

    return check


def phase_is(k8s, phase):
    async def check():
        run = stored(k8s, "rlruns", NAME)
        return (run or {}).get("status", {}).get("phase") == phase and run

    return check


def gone(k8s):
    async def check():
        return stored(k8s, "rlruns", NAME) is None

    return check


def conditions(run):
    return {c["type"]: c["status"] for c in run["status"]["conditions"]}


def mark_ready(kube):
    """Plays the StatefulSet/Deployment controllers: every replica becomes ready."""
    for api_version, kind, name in WORKLOADS:
        replicas = kube.get(api_version, kind, NS, name)["spec"]["replicas"]
        kube.patch(
            api_version,
            kind,
            NS,
            name,
            {"status": {"replicas": replicas, "readyReplicas": replicas}},
            "status",
        )


def events(k8s) -> list[dict]:
    return [o.raw for key, o in k8s.objects.items() if key[0].plural == "events" and not o.deleted]


async def test_operator_end_to_end(k8s, kube, run_operator, orchestrator_stub, eventually):
    await run_operator(
        status_interval_s=0.2, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    run = await call(kube.create, copy.deepcopy(SAMPLE))
    uid = run["metadata"]["uid"]

    # 1-2. The children appear, each owned by the run.
    await eventually(has(k8s, WORKLOADS | KEPT), message="children created")
    for api_version, kind, name in WORKLOADS | KEPT:
        obj = await call(kube.get, api_version, kind, NS, name)
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("RLRun", NAME, uid, True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == NAME
    config_map = await call(kube.get, "v1", "ConfigMap", NS, f"{NAME}-config")
    assert (
        f'address = "{NAME}-orchestrator.{NS}.svc.cluster.local:50051"' in config_map["data"]["config.toml"]
    )

    # Pending: the orchestrator says so and nothing is ready yet.
    run = await eventually(phase_is(k8s, "Pending"), message="phase Pending")
    assert "rlrun.dev/finalizer" in run["metadata"]["finalizers"]
    assert run["status"]["observedGeneration"] == run["metadata"]["generation"] == 1
    assert conditions(run)["ConfigValid"] == "True"
    assert conditions(run)["InferenceReady"] == "False"

    # 3. The status follows the stand-in orchestrator.
    await call(mark_ready, kube)
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_RUNNING,
        step=7,
        max_steps=100,
        policy_version=7,
        train_reward=0.625,
        eval_reward=0.5,
        off_policy_lag=1,
        tokens_per_s=1234.5,
    )

    async def running_at_step_7():
        run = stored(k8s, "rlruns", NAME)
        return run["status"].get("phase") == "Running" and run["status"].get("step") == 7 and run

    run = await eventually(running_at_step_7, message="phase Running at step 7")
    status = run["status"]
    assert (status["policyVersion"], status["reward"], status["evalReward"], status["maxSteps"]) == (
        7,
        0.625,
        0.5,
        100,
    )
    assert status["tokensPerSecond"] == 1234.5 and status["startTime"]
    assert conditions(run) == {
        "ConfigValid": "True",
        "InferenceReady": "True",
        "EnvServersReady": "True",
        "TrainerReady": "True",
        "Progressing": "True",
        "Degraded": "False",
        "Restarted": "False",
    }
    assert orchestrator_stub.calls >= 2
    # The run's generated Secret and NetworkPolicy, owned by it; the status poll carries the
    # token the pods mount (the stand-in records it), and the operator read no Secret for it.
    secret = stored(k8s, "secrets", f"{NAME}-auth")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert orchestrator_stub.authorization == f"Bearer {token}"
    policy = stored(k8s, "networkpolicies", f"{NAME}-network")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
    await eventually(
        lambda: any(e.get("reason") == "Running" for e in events(k8s)), message="a Running event"
    )
    assert all(e["involvedObject"]["uid"] == uid for e in events(k8s))

    # Suspend: the pods go; storage, config and Services stay. Resume brings the pods back.
    await call(kube.patch, *RLRUN, NS, NAME, {"spec": {"suspend": True}})
    await eventually(has(k8s, KEPT), message="workloads deleted on suspend")
    run = await eventually(phase_is(k8s, "Suspended"), message="phase Suspended")
    assert run["status"]["observedGeneration"] == 2
    await call(kube.patch, *RLRUN, NS, NAME, {"spec": {"suspend": False}})
    await eventually(has(k8s, WORKLOADS | KEPT), message="workloads back after resume")
    await call(mark_ready, kube)
    await eventually(phase_is(k8s, "Running"), message="Running again")

    # The run finishes: the GPUs are freed (workloads deleted), the PVC stays, the phase sticks.
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_SUCCEEDED,
        step=100,
        max_steps=100,
        policy_version=100,
        train_reward=0.9,
    )
    run = await eventually(phase_is(k8s, "Succeeded"), message="phase Succeeded")
    assert run["status"]["completionTime"] and run["status"]["step"] == 100
    await eventually(has(k8s, KEPT), message="workloads deleted once finished")
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_PENDING
    )
    await asyncio.sleep(0.6)
    assert (await call(get_run, kube))["status"]["phase"] == "Succeeded"

    # 4-5. Delete: the children go, then the finalizer is released and the object disappears.
    await call(kube.delete, *RLRUN, NS, NAME)
    await eventually(gone(k8s), message="RLRun gone after its finalizer")
    assert await call(present, kube) == set()
    assert stored(k8s, "secrets", f"{NAME}-auth") is None
    assert stored(k8s, "networkpolicies", f"{NAME}-network") is None
    assert k8s.secret_reads == []  # from the first apply to the cleanup


async def test_invalid_config_creates_no_pods(k8s, kube, run_operator, orchestrator_stub, eventually):
    await run_operator(status_interval_s=0.2, status_address=f"127.0.0.1:{orchestrator_stub.port}")
    bad = copy.deepcopy(SAMPLE)
    bad["spec"]["config"] = bad["spec"]["config"].replace("group_size = 8", "group_size = 0")
    await call(kube.create, bad)
    run = await eventually(phase_is(k8s, "Failed"), message="phase Failed")
    valid = next(c for c in run["status"]["conditions"] if c["type"] == "ConfigValid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidConfig"
    assert "orchestrator.group_size" in valid["message"]
    await asyncio.sleep(0.5)
    assert await call(present, kube) == set()
    assert orchestrator_stub.calls == 0
    await eventually(
        lambda: any(e.get("reason") == "InvalidConfig" for e in events(k8s)), message="a warning event"
    )

    # Fixing the spec recovers the run.
    await call(kube.patch, *RLRUN, NS, NAME, {"spec": {"config": SAMPLE["spec"]["config"]}})
    await eventually(has(k8s, WORKLOADS | KEPT), message="children after the fix")
    run = await eventually(phase_is(k8s, "Pending"), message="phase Pending after the fix")
    assert conditions(run)["ConfigValid"] == "True"


async def test_an_algorithm_args_typo_fails_the_run_naming_the_key(
    k8s, kube, run_operator, orchestrator_stub, eventually
):
    """The operator checks algorithm ids and algorithm_args as `rlrun check-config` does: a typo
    fails the run at once, in the status, before any pod starts."""
    await run_operator(status_interval_s=0.2, status_address=f"127.0.0.1:{orchestrator_stub.port}")
    bad = copy.deepcopy(SAMPLE)
    bad["spec"]["config"] += "\n[orchestrator.algorithm_args.grpo]\nclip_epsilon_hgih = 0.3\n"
    await call(kube.create, bad)
    run = await eventually(phase_is(k8s, "Failed"), message="phase Failed")
    valid = next(c for c in run["status"]["conditions"] if c["type"] == "ConfigValid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidConfig"
    assert "spec.config: orchestrator.algorithm_args.grpo: clip_epsilon_hgih" in valid["message"]
    await asyncio.sleep(0.5)
    assert await call(present, kube) == set()
    assert orchestrator_stub.calls == 0


async def test_drift_is_repaired_and_finished_runs_expire(
    k8s, kube, run_operator, orchestrator_stub, eventually
):
    await run_operator(
        status_interval_s=0.2, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    run = copy.deepcopy(SAMPLE)
    run["spec"]["ttlSecondsAfterFinished"] = 1
    await call(kube.create, run)
    await eventually(has(k8s, WORKLOADS | KEPT), message="children created")

    # Someone deletes the trainer or edits the orchestrator: the next status tick puts them back.
    await call(kube.delete, "apps/v1", "StatefulSet", NS, f"{NAME}-trainer")
    await call(kube.patch, "apps/v1", "Deployment", NS, f"{NAME}-orchestrator", {"spec": {"replicas": 5}})

    async def repaired():
        orchestrator = stored(k8s, "deployments", f"{NAME}-orchestrator")
        return stored(k8s, "statefulsets", f"{NAME}-trainer") and orchestrator["spec"]["replicas"] == 1

    await eventually(repaired, message="trainer recreated and orchestrator replicas restored")

    # It fails; one second after completion the TTL deletes the RLRun, and the children go with it.
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_FAILED, step=3, last_error="every batch was filtered 3 times"
    )
    failed = await eventually(phase_is(k8s, "Failed"), message="phase Failed")
    assert failed["status"]["lastError"] == "every batch was filtered 3 times"
    await eventually(gone(k8s), timeout=15, message="deleted by ttlSecondsAfterFinished")
    assert await call(present, kube) == set()


def restarted_pod(name: str, component: str, restarts: int) -> tuple[dict, dict]:
    """A pod of the run as its workload's controller would create it, and the status kubelet
    reports for it (`restarts` restarts, the last one OOMKilled)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/name": "rlrun",
                "app.kubernetes.io/instance": NAME,
                "app.kubernetes.io/component": component,
                "rlrun.dev/run": NAME,
            },
        },
        "spec": {"containers": [{"name": component, "image": "x"}]},
    }
    last = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2025-01-01T12:00:00Z"}}
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": component,
                "ready": True,
                "restartCount": restarts,
                "lastState": last if restarts else {},
            }
        ],
    }
    return pod, status


async def test_scaling_inference_leaves_trainer_and_orchestrator_running_and_restarts_show(
    k8s, kube, run_operator, orchestrator_stub, eventually
):
    await run_operator(
        status_interval_s=0.2, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    await call(kube.create, copy.deepcopy(SAMPLE))
    await eventually(has(k8s, WORKLOADS | KEPT), message="children created")
    untouched = {
        ("statefulsets", f"{NAME}-trainer"): stored(k8s, "statefulsets", f"{NAME}-trainer"),
        ("deployments", f"{NAME}-orchestrator"): stored(k8s, "deployments", f"{NAME}-orchestrator"),
        ("deployments", f"{NAME}-env-reverse-text"): stored(k8s, "deployments", f"{NAME}-env-reverse-text"),
    }
    versions = {key: obj["metadata"]["resourceVersion"] for key, obj in untouched.items()}
    inference_template = stored(k8s, "statefulsets", f"{NAME}-inference")["spec"]["template"]
    assert stored(k8s, "poddisruptionbudgets", f"{NAME}-inference") is None  # one replica

    # Scale inference: the run file gets the new addresses, inference a budget, and no other
    # workload is even patched (their pods keep running; the trainer re-reads the file).
    await call(kube.patch, *RLRUN, NS, NAME, {"spec": {"inference": {"replicas": 2}}})

    async def scaled():
        inference = stored(k8s, "statefulsets", f"{NAME}-inference")
        config = stored(k8s, "configmaps", f"{NAME}-config")["data"]["config.toml"]
        return (
            inference["spec"]["replicas"] == 2
            and f"{NAME}-inference-1.{NAME}-inference" in config
            and stored(k8s, "poddisruptionbudgets", f"{NAME}-inference")
        )

    budget = await eventually(scaled, message="inference scaled to 2 with a budget")
    assert budget["spec"]["maxUnavailable"] == 1
    await asyncio.sleep(0.6)  # a few more status ticks
    for (plural, name), version in versions.items():
        assert stored(k8s, plural, name)["metadata"]["resourceVersion"] == version, name
    assert stored(k8s, "statefulsets", f"{NAME}-inference")["spec"]["template"] == inference_template

    # Restarts: the status counts them per component from the pods, and says so.
    pods = [restarted_pod(f"{NAME}-inference-{i}", "inference", 0) for i in range(2)]
    pods.append(restarted_pod(f"{NAME}-trainer-0", "trainer", 1))
    for pod, status in pods:
        await call(kube.create, pod)
        await call(kube.patch, "v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")

    def restarts_are(counts):
        async def check():
            run = stored(k8s, "rlruns", NAME)
            return run["status"].get("restarts") == counts and run

        return check

    run = await eventually(restarts_are({"inference": 0, "trainer": 1}), message="restarts in the status")
    restarted = next(c for c in run["status"]["conditions"] if c["type"] == "Restarted")
    assert restarted["status"] == "True" and f"{NAME}-trainer-0: OOMKilled" in restarted["message"]
    await eventually(
        lambda: [e for e in events(k8s) if e.get("reason") == "Restarted"], message="a Restarted event"
    )
    pod, status = restarted_pod(f"{NAME}-trainer-0", "trainer", 2)
    await call(kube.patch, "v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")
    await eventually(restarts_are({"inference": 0, "trainer": 2}), message="the second restart")
    await eventually(
        lambda: len([e for e in events(k8s) if e.get("reason") == "Restarted"]) == 2,
        message="an event for each restart",
    )

    # Back to one replica: the budget goes.
    await call(kube.patch, *RLRUN, NS, NAME, {"spec": {"inference": {"replicas": 1}}})
    await eventually(
        lambda: stored(k8s, "poddisruptionbudgets", f"{NAME}-inference") is None, message="budget pruned"
    )


async def test_fields_removed_from_the_run_leave_its_workloads(
    k8s, kube, run_operator, orchestrator_stub, eventually
):
    """Server-side apply: a nodeSelector, a priorityClassName and the Kueue queue (the queue
    label and the pod-group keys on every pod template) taken out of the RLRun are taken out of
    every workload too (a merge patch would leave them)."""
    await run_operator(
        status_interval_s=0.2, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    run = copy.deepcopy(SAMPLE)
    run["spec"].update(
        placement={"nodeSelector": {"pool": "gpu-a"}},
        priorityClassName="research-high",
        queueName="team-a",
    )
    await call(kube.create, run)

    def workloads():
        found = [stored(k8s, plural, name) for _, kind, name in WORKLOADS for plural in [kind.lower() + "s"]]
        return found if all(found) else None

    def placed(obj):
        pod = obj["spec"]["template"]["spec"]
        meta = obj["spec"]["template"]["metadata"]
        # The workload object itself never carries the queue label (one Kueue group per run).
        assert "kueue.x-k8s.io/queue-name" not in obj["metadata"]["labels"]
        return (
            pod.get("nodeSelector"),
            pod.get("priorityClassName"),
            meta["labels"].get("kueue.x-k8s.io/queue-name"),
            meta["labels"].get("kueue.x-k8s.io/pod-group-name"),
            meta["annotations"].get("kueue.x-k8s.io/pod-group-total-count"),
            meta["annotations"].get("kueue.x-k8s.io/pod-group-serving"),
        )

    def all_placed(expected):
        async def check():
            found = workloads()
            return found is not None and all(placed(obj) == expected for obj in found)

        return check

    total = str(sum(obj["spec"]["replicas"] for obj in await eventually(workloads, message="workloads")))
    gang = ("team-a", f"{NAME}-group", total, "true")
    await eventually(all_placed(({"pool": "gpu-a"}, "research-high", *gang)), message="placed")
    await call(
        kube.patch,
        *RLRUN,
        NS,
        NAME,
        {"spec": {"placement": None, "priorityClassName": None, "queueName": None}},
    )
    await eventually(
        all_placed((None, None, None, None, None, None)), message="removed fields left every workload"
    )


async def test_why_a_component_does_not_run_is_in_the_conditions(
    k8s, kube, run_operator, orchestrator_stub, eventually
):
    await run_operator(
        status_interval_s=0.2, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    await call(kube.create, copy.deepcopy(SAMPLE))
    await eventually(has(k8s, WORKLOADS | KEPT), message="children created")
    unscheduled, _ = restarted_pod(f"{NAME}-inference-0", "inference", 0)
    unscheduled_status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    looping, looping_status = restarted_pod(f"{NAME}-trainer-0", "trainer", 5)
    looping_status["containerStatuses"][0].update(
        ready=False, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}
    )
    attaching, _ = restarted_pod(f"{NAME}-env-reverse-text-7c9-x", "env-server", 0)
    attaching_status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    for pod, status in (
        (unscheduled, unscheduled_status),
        (looping, looping_status),
        (attaching, attaching_status),
    ):
        await call(kube.create, pod)
        await call(kube.patch, "v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")
    await call(
        kube.create,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "multi-attach", "namespace": NS},
            "type": "Warning",
            "reason": "FailedAttachVolume",
            "message": "Multi-Attach error for volume pvc-1",
            "lastTimestamp": "2025-01-01T12:00:00Z",
            "involvedObject": {"kind": "Pod", "name": attaching["metadata"]["name"], "namespace": NS},
        },
    )

    async def explained():
        run = stored(k8s, "rlruns", NAME)
        found = {c["type"]: c for c in (run or {}).get("status", {}).get("conditions", [])}
        wanted = ("InferenceReady", "TrainerReady", "EnvServersReady")
        return all(found.get(k, {}).get("reason") not in (None, "NotReady") for k in wanted) and found

    found = await eventually(explained, message="conditions say why")
    assert found["InferenceReady"]["reason"] == "Unschedulable"
    assert "0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in found["InferenceReady"]["message"]
    assert found["TrainerReady"]["reason"] == "CrashLoopBackOff"
    assert "keeps exiting (last: OOMKilled, exit code 137)" in found["TrainerReady"]["message"]
    # Scheduled, but stuck before its container: the pod's Warning Event says why.
    assert found["EnvServersReady"]["reason"] == "FailedAttachVolume"
    assert "Multi-Attach error for volume pvc-1" in found["EnvServersReady"]["message"]
