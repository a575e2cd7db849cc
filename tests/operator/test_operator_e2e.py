"""The kopf operator end to end against a real API server (tests/operator/conftest.py), as the
chart's ServiceAccount, with a stand-in orchestrator for the status poll (the run's pods are
kwok pods, which run nothing): apply an RLRun -> children with owner references -> the real
controllers and the scheduler put its pods on nodes, kwok reports them Ready -> status from
the orchestrator's GetStatus -> suspend and resume -> the run finishes (pods go, storage stays)
-> delete -> finalizer released, and the garbage collector and the operator leave nothing.
"""

from __future__ import annotations

import asyncio
import base64

from rlrun.v1 import orchestrator_pb2

from .runs import (
    KEPT,
    NAME,
    RLRUN,
    SAMPLE,
    WORKLOADS,
    all_pods_ready,
    call,
    conditions,
    events,
    get_run,
    has,
    operator_calls,
    phase_is,
    pods,
    present,
    sample,
)


async def test_operator_end_to_end(
    cluster, namespace, kube, kubectl, run_operator, orchestrator_stub, eventually, operator_account
):
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    run = await call(kube.create, sample(namespace))
    uid = run["metadata"]["uid"]

    # 1-2. The children appear, each owned by the run.
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="children created")
    for api_version, kind, name in WORKLOADS | KEPT:
        obj = await call(kube.get, api_version, kind, namespace, name)
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("RLRun", NAME, uid, True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == NAME
    config_map = await call(kube.get, "v1", "ConfigMap", namespace, f"{NAME}-config")
    assert (
        f'address = "{NAME}-orchestrator.{namespace}.svc.cluster.local:50051"'
        in config_map["data"]["config.toml"]
    )
    run = await call(get_run, kube, namespace)
    assert "rlrun.dev/finalizer" in run["metadata"]["finalizers"]

    # The controllers create the pods, the scheduler binds them (the checkpoint claim was bound
    # by the PersistentVolume controller first), kwok reports them Ready; the workloads' status
    # says so, and so does the run's.
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="4 pods Ready")
    claim = await call(kube.get, "v1", "PersistentVolumeClaim", namespace, f"{NAME}-checkpoints")
    assert claim["status"]["phase"] == "Bound"
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

    def running_at_step_7():
        run = get_run(kube, namespace)
        status = run.get("status", {})
        return (
            status.get("phase") == "Running"
            and status.get("step") == 7
            and conditions(run).get("InferenceReady") == "True"
            and run
        )

    run = await eventually(running_at_step_7, timeout=60, message="phase Running at step 7")
    status = run["status"]
    assert status["observedGeneration"] == run["metadata"]["generation"] == 1
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
    assert orchestrator_stub.calls >= 1  # the first poll comes an interval after the create pass
    # `kubectl get rlrun` prints them in the CRD's columns (the API server's Table output).
    _, out, _ = await kubectl("get", "rlrun", NAME, "--no-headers")
    assert out.split()[:5] == [NAME, "Running", "7", "0.625", "7"]
    # The run's generated Secret and NetworkPolicy, owned by it; the status poll carries the
    # token the pods mount (the stand-in records it), and the operator read no Secret for it.
    secret = await call(kube.get, "v1", "Secret", namespace, f"{NAME}-auth")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert orchestrator_stub.authorization == f"Bearer {token}"
    policy = await call(kube.get, "networking.k8s.io/v1", "NetworkPolicy", namespace, f"{NAME}-network")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
    await eventually(
        lambda: any(e.get("reason") == "Running" for e in events(kube, namespace)), message="a Running event"
    )
    assert all(e["involvedObject"]["uid"] == uid for e in await call(events, kube, namespace))

    # Suspend: the pods go; storage, config and Services stay. Resume brings the pods back.
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"suspend": True}})
    await eventually(has(kube, namespace, KEPT), message="workloads deleted on suspend")
    run = await eventually(phase_is(kube, namespace, "Suspended"), message="phase Suspended")
    assert run["status"]["observedGeneration"] == 2
    await eventually(lambda: not pods(kube, namespace), timeout=60, message="the pods are gone")
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"suspend": False}})
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="workloads back after resume")
    await eventually(all_pods_ready(kube, namespace, 4), timeout=60, message="pods Ready again")
    await eventually(phase_is(kube, namespace, "Running"), timeout=60, message="Running again")

    # The run finishes: the GPUs are freed (workloads deleted), the PVC stays, the phase sticks.
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_SUCCEEDED,
        step=100,
        max_steps=100,
        policy_version=100,
        train_reward=0.9,
    )
    run = await eventually(phase_is(kube, namespace, "Succeeded"), message="phase Succeeded")
    assert run["status"]["completionTime"] and run["status"]["step"] == 100
    await eventually(has(kube, namespace, KEPT), message="workloads deleted once finished")
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_PENDING
    )
    await asyncio.sleep(1.5)
    assert (await call(get_run, kube, namespace))["status"]["phase"] == "Succeeded"

    # 4-5. Delete: the children go, then the finalizer is released and the object disappears.
    await call(kube.delete, *RLRUN, namespace, NAME)
    await eventually(lambda: get_run(kube, namespace) is None, message="RLRun gone after its finalizer")
    await eventually(lambda: present(kube, namespace) == set(), message="no child left")
    assert await call(kube.get, "v1", "Secret", namespace, f"{NAME}-auth") is None
    assert await call(kube.get, "networking.k8s.io/v1", "NetworkPolicy", namespace, f"{NAME}-network") is None
    # From the first apply to the cleanup, the operator wrote and deleted the run's Secret but
    # never read one (the API server's audit log of the ServiceAccount's requests).
    user = f"system:serviceaccount:rlrun-system:{operator_account}"
    secret_calls = await call(operator_calls, cluster, user, "secrets")
    assert {verb for verb, _ in secret_calls} == {"patch", "delete"}, secret_calls


async def test_invalid_config_creates_no_pods(namespace, kube, run_operator, orchestrator_stub, eventually):
    await run_operator(status_interval_s=0.5, status_address=f"127.0.0.1:{orchestrator_stub.port}")
    bad = sample(namespace)
    bad["spec"]["config"] = bad["spec"]["config"].replace("group_size = 8", "group_size = 0")
    await call(kube.create, bad)
    run = await eventually(phase_is(kube, namespace, "Failed"), message="phase Failed")
    valid = next(c for c in run["status"]["conditions"] if c["type"] == "ConfigValid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidConfig"
    assert "orchestrator.group_size" in valid["message"]
    await asyncio.sleep(1)
    assert await call(present, kube, namespace) == set()
    assert orchestrator_stub.calls == 0
    await eventually(
        lambda: any(e.get("reason") == "InvalidConfig" for e in events(kube, namespace)),
        message="a warning event",
    )

    # Fixing the spec recovers the run.
    await call(kube.patch, *RLRUN, namespace, NAME, {"spec": {"config": SAMPLE["spec"]["config"]}})
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="children after the fix")
    run = await eventually(phase_is(kube, namespace, "Pending"), message="phase Pending after the fix")
    assert conditions(run)["ConfigValid"] == "True"


async def test_an_algorithm_args_typo_fails_the_run_naming_the_key(
    namespace, kube, run_operator, orchestrator_stub, eventually
):
    """The operator checks algorithm ids and algorithm_args as `rlrun check-config` does: a typo
    fails the run at once, in the status, before any pod starts."""
    await run_operator(status_interval_s=0.5, status_address=f"127.0.0.1:{orchestrator_stub.port}")
    bad = sample(namespace)
    # (The sample has the table already: a second one would be a TOML error, not the typo.)
    table = "[orchestrator.algorithm_args.grpo]\n"
    assert table in bad["spec"]["config"]
    bad["spec"]["config"] = bad["spec"]["config"].replace(table, table + "clip_epsilon_hgih = 0.3\n")
    await call(kube.create, bad)
    run = await eventually(phase_is(kube, namespace, "Failed"), message="phase Failed")
    valid = next(c for c in run["status"]["conditions"] if c["type"] == "ConfigValid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidConfig"
    assert "spec.config: orchestrator.algorithm_args.grpo: clip_epsilon_hgih" in valid["message"]
    await asyncio.sleep(1)
    assert await call(present, kube, namespace) == set()
    assert orchestrator_stub.calls == 0


async def test_drift_is_repaired_and_finished_runs_expire(
    namespace, kube, run_operator, orchestrator_stub, eventually
):
    await run_operator(
        status_interval_s=0.5, status_timeout_s=1.0, status_address=f"127.0.0.1:{orchestrator_stub.port}"
    )
    await call(kube.create, sample(namespace, ttlSecondsAfterFinished=1))
    await eventually(has(kube, namespace, WORKLOADS | KEPT), message="children created")

    # Someone deletes the trainer or edits the orchestrator: the next status tick puts them back.
    await call(kube.delete, "apps/v1", "StatefulSet", namespace, f"{NAME}-trainer")
    await call(
        kube.patch, "apps/v1", "Deployment", namespace, f"{NAME}-orchestrator", {"spec": {"replicas": 5}}
    )

    def repaired():
        orchestrator = kube.get("apps/v1", "Deployment", namespace, f"{NAME}-orchestrator")
        trainer = kube.get("apps/v1", "StatefulSet", namespace, f"{NAME}-trainer")
        return (
            trainer
            and not trainer["metadata"].get("deletionTimestamp")
            and orchestrator["spec"]["replicas"] == 1
        )

    await eventually(repaired, message="trainer recreated and orchestrator replicas restored")

    # It fails; one second after completion the TTL deletes the RLRun, and the children go with it.
    orchestrator_stub.response = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_FAILED, step=3, last_error="every batch was filtered 3 times"
    )
    failed = await eventually(phase_is(kube, namespace, "Failed"), message="phase Failed")
    assert failed["status"]["lastError"] == "every batch was filtered 3 times"
    await eventually(lambda: get_run(kube, namespace) is None, timeout=30, message="deleted by the TTL")
    await eventually(lambda: present(kube, namespace) == set(), message="no child left")
