"""Status mapping: orchestrator answers and workload readiness -> RLRun.status and Events."""

from __future__ import annotations

import datetime as dt

import pytest

from rlrun.common.wire.orchestrator import RunStatus, status_from_proto
from rlrun.operator.pods import PodState, pod_state
from rlrun.operator.reconcile import Workload
from rlrun.operator.spec import RLRunStatus
from rlrun.operator.status import (
    Observation,
    WorkloadState,
    build_status,
    is_finished,
    status_patch,
    transition_events,
    ttl_expired,
    workload_state,
)
from rlrun.v1 import orchestrator_pb2

T0 = dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.UTC)
READY = [
    WorkloadState("inference", "r-inference", 2, 2, 2),
    WorkloadState("env-server", "r-env", 1, 1, 1),
    WorkloadState("orchestrator", "r-orchestrator", 1, 1, 1),
    WorkloadState("trainer", "r-trainer", 1, 2, 1),
]


def report(phase="RUN_PHASE_RUNNING", **fields) -> RunStatus:
    return status_from_proto(orchestrator_pb2.GetRunStatusResponse(phase=phase, **fields))


def observe(previous=None, now=T0, **kwargs):
    kwargs.setdefault("generation", 3)
    kwargs.setdefault("workloads", READY)
    return build_status(previous, Observation(now=now, **kwargs))


def conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("RUN_PHASE_UNSPECIFIED", "Pending"),
        ("RUN_PHASE_PENDING", "Pending"),
        ("RUN_PHASE_WARMUP", "Running"),
        ("RUN_PHASE_RUNNING", "Running"),
        ("RUN_PHASE_STOPPING", "Running"),
        ("RUN_PHASE_SUCCEEDED", "Succeeded"),
        ("RUN_PHASE_FAILED", "Failed"),
    ],
)
def test_orchestrator_phases_map_to_run_phases(phase, expected):
    assert orchestrator_pb2.RunPhase.Value(phase) is not None  # every name is a real enum value
    assert observe(polled=True, report=report(phase))["phase"] == expected


def test_running_status_carries_the_orchestrator_numbers():
    message = orchestrator_pb2.GetRunStatusResponse(
        phase=orchestrator_pb2.RUN_PHASE_RUNNING,
        step=12,
        max_steps=100,
        policy_version=12,
        train_reward=0.75,
        eval_reward=0.5,
        off_policy_lag=1,
        tokens_per_s=99.5,
        groups_dropped_stale=3,
    )
    status = observe(polled=True, report=status_from_proto(message))
    assert status["phase"] == "Running"
    assert (status["step"], status["maxSteps"], status["policyVersion"]) == (12, 100, 12)
    assert (status["reward"], status["evalReward"], status["offPolicyLag"]) == (0.75, 0.5, 1)
    assert (status["tokensPerSecond"], status["groupsDroppedStale"]) == (99.5, 3)
    assert status["observedGeneration"] == 3
    assert status["startTime"] == status["lastProgressTime"] == "2025-01-01T12:00:00Z"
    assert conditions(status) == {
        "ConfigValid": ("True", "Valid"),
        "InferenceReady": ("True", "Ready"),
        "EnvServersReady": ("True", "Ready"),
        "TrainerReady": ("True", "Ready"),
        "Progressing": ("True", "StepAdvancing"),
        "Degraded": ("False", "Healthy"),
    }
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])


def test_not_ready_components_are_reported_and_degrade_a_running_run():
    workloads = [WorkloadState("inference", "r-inference", 1, 2, 2), *READY[1:]]
    pending = observe(polled=True, report=report("RUN_PHASE_PENDING"), workloads=workloads)
    assert conditions(pending)["InferenceReady"] == ("False", "NotReady")
    assert (
        "r-inference: 1/2 ready"
        in next(c for c in pending["conditions"] if c["type"] == "InferenceReady")["message"]
    )
    assert conditions(pending)["Degraded"] == ("False", "Healthy")  # still starting
    running = observe(polled=True, report=report(), workloads=workloads)
    assert conditions(running)["Degraded"] == ("True", "ComponentsNotReady")


def test_no_managed_env_servers_means_external_ones():
    status = observe(
        polled=True, report=report(), workloads=[w for w in READY if w.component != "env-server"]
    )
    assert conditions(status)["EnvServersReady"] == ("True", "External")


def test_an_unreachable_orchestrator_keeps_running_runs_running_but_degraded():
    running = observe(polled=True, report=report(step=5))
    lost = observe(
        running, now=T0 + dt.timedelta(seconds=10), polled=True, report=None, poll_error="UNAVAILABLE"
    )
    assert lost["phase"] == "Running" and lost["step"] == 5
    assert conditions(lost)["Degraded"] == ("True", "OrchestratorUnreachable")
    assert observe(polled=True, report=None)["phase"] == "Pending"


def test_no_step_progress_for_15_minutes_is_stalled():
    first = observe(polled=True, report=report(step=5))
    later = observe(first, now=T0 + dt.timedelta(minutes=14), polled=True, report=report(step=5))
    assert conditions(later)["Progressing"] == ("True", "StepAdvancing")
    stalled = observe(later, now=T0 + dt.timedelta(minutes=16), polled=True, report=report(step=5))
    assert conditions(stalled)["Progressing"] == ("False", "Stalled")
    moving = observe(stalled, now=T0 + dt.timedelta(minutes=17), polled=True, report=report(step=6))
    assert conditions(moving)["Progressing"] == ("True", "StepAdvancing")
    assert moving["lastProgressTime"] == "2025-01-01T12:17:00Z"


def test_finishing_is_sticky_and_starts_the_ttl():
    running = observe(polled=True, report=report(step=99))
    done = observe(
        running, now=T0 + dt.timedelta(minutes=1), polled=True, report=report("RUN_PHASE_SUCCEEDED", step=100)
    )
    assert done["phase"] == "Succeeded" and done["completionTime"] == "2025-01-01T12:01:00Z"
    assert is_finished(done)
    assert conditions(done)["InferenceReady"] == ("False", "Finished")
    later = observe(
        done, now=T0 + dt.timedelta(minutes=2), polled=True, report=report("RUN_PHASE_PENDING"), workloads=[]
    )
    assert later["phase"] == "Succeeded" and later["step"] == 100
    assert not ttl_expired(later, 3600, T0 + dt.timedelta(minutes=30))
    assert ttl_expired(later, 3600, T0 + dt.timedelta(minutes=61))
    assert not ttl_expired(later, None, T0 + dt.timedelta(days=9))
    assert not ttl_expired(running, 0, T0 + dt.timedelta(days=9))


def test_failed_runs_carry_the_last_error():
    failed = observe(
        polled=True, report=report("RUN_PHASE_FAILED", last_error="every batch was filtered 3 times")
    )
    assert failed["phase"] == "Failed" and failed["lastError"] == "every batch was filtered 3 times"
    assert conditions(failed)["Degraded"] == ("True", "RunError")
    assert failed["message"] == "every batch was filtered 3 times"
    assert ("Warning", "Failed") in [(k, r) for k, r, _ in transition_events({}, failed)]


def test_an_invalid_config_is_failed_without_completion_and_recovers():
    bad = observe(error="spec.config: orchestrator.group_size: must be >= 1", workloads=[])
    assert bad["phase"] == "Failed" and not bad.get("completionTime")
    assert conditions(bad)["ConfigValid"] == ("False", "InvalidConfig")
    assert bad["message"].startswith("spec.config: orchestrator.group_size")
    assert not is_finished(bad)
    fixed = observe(bad, polled=False)
    assert fixed["phase"] == "Pending" and conditions(fixed)["ConfigValid"] == ("True", "Valid")


def test_suspended_runs():
    status = observe(suspended=True, workloads=[])
    assert status["phase"] == "Suspended"
    assert conditions(status)["TrainerReady"] == ("False", "Suspended")


def test_without_polling_the_previous_orchestrator_view_is_kept():
    running = observe(polled=True, report=report(step=8, train_reward=0.5))
    again = observe(running, now=T0 + dt.timedelta(seconds=5), polled=False)
    assert again["phase"] == "Running" and again["step"] == 8 and again["reward"] == 0.5


def test_condition_times_change_only_on_transitions():
    first = observe(polled=True, report=report(step=1))
    same = observe(first, now=T0 + dt.timedelta(minutes=1), polled=True, report=report(step=2))
    times = {c["type"]: c["lastTransitionTime"] for c in same["conditions"]}
    assert set(times.values()) == {"2025-01-01T12:00:00Z"}
    lost = observe(same, now=T0 + dt.timedelta(minutes=2), polled=True, report=None)
    degraded = next(c for c in lost["conditions"] if c["type"] == "Degraded")
    assert degraded["lastTransitionTime"] == "2025-01-01T12:02:00Z"


def test_events_on_transitions_only():
    pending = observe(polled=True, report=report("RUN_PHASE_PENDING"))
    assert transition_events({}, pending) == [
        ("Normal", "Pending", "phase None -> Pending: waiting for the services to start")
    ]
    assert transition_events(pending, observe(pending, polled=True, report=report("RUN_PHASE_PENDING"))) == []
    running = observe(pending, polled=True, report=report(step=1))
    kinds = transition_events(pending, running)
    assert kinds[0][:2] == ("Normal", "Running")
    lost = observe(running, polled=True, report=None, poll_error="UNAVAILABLE")
    assert ("Warning", "OrchestratorUnreachable") in [(k, r) for k, r, _ in transition_events(running, lost)]


def test_status_patch_sets_changes_and_removes_cleared_keys():
    previous = {"phase": "Running", "lastError": "boom", "step": 3}
    new = {"phase": "Running", "lastError": None, "step": 4}
    assert status_patch(previous, new) == {"step": 4, "lastError": None}


def test_the_status_round_trips_through_the_crds_form_and_every_key_is_written():
    """build_status writes every key of the CRD's status (None: remove it), and what the API
    server stores reads back as the same status: the next pass writes nothing."""
    status = observe(polled=True, report=report(step=4, train_reward=0.5, last_error="late"), pods=[])
    assert set(status) == set(RLRunStatus.model_json_schema(by_alias=True)["properties"])
    stored = {k: v for k, v in status.items() if v is not None}
    assert RLRunStatus.from_crd(stored).to_crd() == status
    assert status_patch(stored, RLRunStatus.from_crd(stored).to_crd()) == {}
    # Keys the schema lacks are pruned by the API server; reading a status drops them the same way.
    assert RLRunStatus.from_crd({**stored, "kopf": {"progress": {}}}).to_crd() == status


def test_workload_state_reads_ready_replicas():
    workload = Workload("trainer", "StatefulSet", "r-trainer", 3, 1)
    assert workload_state(workload, None).ready == 0
    state = workload_state(workload, {"status": {"readyReplicas": 1}})
    assert state.is_ready and state.replicas == 3


def live_pod(name, component, *containers):
    """A Pod as the API server returns it; each container is (restartCount, lastState)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/component": component, "rlrun.dev/run": "r"},
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": f"c{i}", "ready": True, "restartCount": count, "lastState": last, "state": {}}
                for i, (count, last) in enumerate(containers)
            ],
        },
    }


def terminated(reason, code, at):
    return {"terminated": {"reason": reason, "exitCode": code, "finishedAt": at, "startedAt": at}}


def test_pod_state_sums_containers_and_keep_the_latest_termination():
    pod = live_pod(
        "r-trainer-0",
        "trainer",
        (2, terminated("OOMKilled", 137, "2025-01-01T11:50:00Z")),
        (1, terminated("Error", 1, "2025-01-01T11:40:00Z")),
    )
    assert pod_state(pod) == PodState("trainer", "r-trainer-0", 3, "OOMKilled", 137, "2025-01-01T11:50:00Z")
    starting = live_pod("r-inference-0", "inference")
    del starting["status"]
    assert pod_state(starting) == PodState("inference", "r-inference-0", 0)
    assert pod_state(live_pod("x", "someone-else", (4, {}))) is None


PODS = [
    PodState("inference", "r-inference-0", 1, "Error", 1, "2025-01-01T11:00:00Z"),
    PodState("inference", "r-inference-1", 0),
    PodState("env-server", "r-env-5d8f-x", 0),
    PodState("trainer", "r-trainer-0", 3, "OOMKilled", 137, "2025-01-01T11:50:00Z"),
    PodState("orchestrator", "r-orchestrator-7c9-y", 0),
]


def test_restarts_per_component_and_the_restarted_condition():
    status = observe(polled=True, report=report(step=4), pods=PODS)
    assert status["restarts"] == {"inference": 1, "env-server": 0, "orchestrator": 0, "trainer": 3}
    restarted = next(c for c in status["conditions"] if c["type"] == "Restarted")
    assert (restarted["status"], restarted["reason"]) == ("True", "ContainersRestarted")
    assert restarted["message"] == (
        "inference: 1 restart (last r-inference-0: Error, exit code 1 at 2025-01-01T11:00:00Z); "
        "trainer: 3 restarts (last r-trainer-0: OOMKilled, exit code 137 at 2025-01-01T11:50:00Z). "
        "The trainer resumes from its newest complete checkpoint."
    )
    assert conditions(status)["Degraded"] == ("False", "Healthy")  # restarts alone are no fault
    calm = observe(polled=True, report=report(step=4), pods=[PodState("trainer", "r-trainer-0", 0)])
    assert calm["restarts"] == {"trainer": 0}
    assert conditions(calm)["Restarted"] == ("False", "NoRestarts")
    assert observe(suspended=True, workloads=[], pods=[])["restarts"] is None


def test_unobserved_pods_keep_the_previous_restarts():
    seen = observe(polled=True, report=report(step=4), pods=PODS)
    unseen = observe(seen, now=T0 + dt.timedelta(seconds=10), polled=True, report=report(step=5))
    assert unseen["restarts"] == seen["restarts"]
    restarted = [c for c in unseen["conditions"] if c["type"] == "Restarted"]
    assert restarted == [c for c in seen["conditions"] if c["type"] == "Restarted"]


def test_every_new_restart_posts_one_warning_event():
    calm = observe(polled=True, report=report(step=4), pods=[PodState("trainer", "r-trainer-0", 0)])
    assert transition_events({}, calm) == [("Normal", "Running", "phase None -> Running: step 4/0")]
    crashed = [PodState("trainer", "r-trainer-0", 1, "Error", 1, "2025-01-01T12:00:30Z")]
    once = observe(calm, polled=True, report=report(step=4), pods=crashed)
    ((kind, reason, message),) = transition_events(calm, once)
    assert (kind, reason) == ("Warning", "Restarted")
    assert message.startswith("trainer: 1 restart (last r-trainer-0: Error, exit code 1")
    assert transition_events(once, observe(once, polled=True, report=report(step=4), pods=crashed)) == []
    # A pod replaced by a new one counts from 0 again: no event for that.
    replaced = observe(once, polled=True, report=report(step=4), pods=[PodState("trainer", "r-trainer-0", 0)])
    assert conditions(replaced)["Restarted"] == ("False", "NoRestarts")
    assert transition_events(once, replaced) == []


def test_status_patch_removes_a_component_that_has_no_pods_any_more():
    previous = {"restarts": {"inference": 1, "model-server": 2}}
    assert status_patch(previous, {"restarts": {"inference": 1}}) == {"restarts": {"model-server": None}}
    assert status_patch(previous, {"restarts": {"inference": 2, "model-server": 2}}) == {
        "restarts": {"inference": 2}
    }
    assert status_patch(previous, {"restarts": None}) == {"restarts": None}


def pending_pod(name, component, conditions=(), containers=()):
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "status": {"phase": "Pending", "conditions": list(conditions), "containerStatuses": list(containers)},
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}


def crash_looping(name, component):
    pod = live_pod(name, component, (4, terminated("OOMKilled", 137, "2025-01-01T11:59:00Z")))
    pod["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
    }
    pod["status"]["containerStatuses"][0]["ready"] = False
    return pod


def event(pod, reason, message, at, kind="Warning"):
    return {
        "type": kind,
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "involvedObject": {"kind": "Pod", "name": pod},
    }


def why(state):
    return state.blocked, state.detail


def test_pod_state_says_why_a_pod_does_not_run():
    unscheduled = pod_state(pending_pod("r-inference-0", "inference", [UNSCHEDULABLE]))
    assert (unscheduled.blocked, unscheduled.detail) == (
        "Unschedulable",
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    looping = pod_state(crash_looping("r-trainer-0", "trainer"))
    assert looping.blocked == "CrashLoopBackOff"
    assert looping.detail == "container c0 keeps exiting (last: OOMKilled, exit code 137)"
    pulling = pending_pod(
        "r-env-x",
        "env-server",
        [{"type": "PodScheduled", "status": "True"}],
        [{"name": "env-server", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}],
    )
    assert why(pod_state(pulling)) == ("ErrImagePull", "container env-server: not found")
    # Scheduled but stuck before any container (a volume that does not attach): the newest
    # Warning Event about the pod says why; other pods' events and Normal events do not count.
    attaching = pending_pod("r-trainer-1", "trainer", [{"type": "PodScheduled", "status": "True"}])
    events = [
        event("r-trainer-1", "FailedMount", "old", "2025-01-01T11:00:00Z"),
        event(
            "r-trainer-1", "FailedAttachVolume", "Multi-Attach error for volume pvc-1", "2025-01-01T11:05:00Z"
        ),
        event("r-trainer-1", "Scheduled", "assigned", "2025-01-01T11:06:00Z", kind="Normal"),
        event("r-trainer-0", "FailedMount", "not mine", "2025-01-01T11:07:00Z"),
    ]
    assert why(pod_state(attaching, events)) == ("FailedAttachVolume", "Multi-Attach error for volume pvc-1")
    starting = pending_pod(
        "r-inference-1",
        "inference",
        [{"type": "PodScheduled", "status": "True"}],
        [{"name": "inference", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    )
    assert pod_state(starting).blocked == ""
    assert pod_state(live_pod("r-inference-2", "inference", (0, {})), events).blocked == ""


def test_component_conditions_carry_the_reason_their_pods_give():
    workloads = [
        WorkloadState("inference", "r-inference", 1, 2, 2),
        WorkloadState("env-server", "r-env", 1, 1, 1),
        WorkloadState("orchestrator", "r-orchestrator", 1, 1, 1),
        WorkloadState("trainer", "r-trainer", 0, 1, 1),
    ]
    pods = [
        pod_state(live_pod("r-inference-0", "inference", (0, {}))),
        pod_state(pending_pod("r-inference-1", "inference", [UNSCHEDULABLE])),
        pod_state(crash_looping("r-trainer-0", "trainer")),
    ]
    status = observe(polled=True, report=report(step=2), workloads=workloads, pods=pods)
    found = {c["type"]: c for c in status["conditions"]}
    assert (found["InferenceReady"]["status"], found["InferenceReady"]["reason"]) == (
        "False",
        "Unschedulable",
    )
    assert found["InferenceReady"]["message"] == (
        "r-inference: 1/2 ready; pod r-inference-1: Unschedulable: "
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    assert found["TrainerReady"]["reason"] == "CrashLoopBackOff"
    assert (
        "pod r-trainer-0: CrashLoopBackOff: container c0 keeps exiting (last: OOMKilled"
        in (found["TrainerReady"]["message"])
    )
    assert found["EnvServersReady"]["reason"] == "Ready"
    assert found["Degraded"]["message"] == "not ready: Inference (Unschedulable), Trainer (CrashLoopBackOff)"
    # A model server's pods explain InferenceReady too.
    model = pod_state(pending_pod("r-model-ref-0", "model-server", [UNSCHEDULABLE]))
    status = observe(polled=True, report=report(step=2), workloads=workloads[:1] + READY[1:], pods=[model])
    assert conditions(status)["InferenceReady"] == ("False", "Unschedulable")
