"""Pure status mapping: what the operator observed -> `RLRun.status`.

Inputs are the previous status, the readiness of the run's workloads, the container restarts
of its pods and (when polled) the orchestrator's `GetStatus` answer. Output is the whole new
status: `phase` (Pending, Running, Succeeded, Failed, Suspended), the conditions ConfigValid,
InferenceReady, EnvServersReady, TrainerReady, Admitted (queued runs: Kueue's admission of the
run's pod group), Progressing, Degraded and Restarted,
`observedGeneration`, step, policy version, rewards, `lastError` and `restarts` per component.
A run becomes finished (`completionTime` set) only when the orchestrator reports it succeeded
or failed; that is sticky, and it is what frees the GPUs and starts `ttlSecondsAfterFinished`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlrun.operator.kueue import Admission
from rlrun.operator.reconcile import (
    ENV_SERVER,
    INFERENCE,
    MODEL_SERVER,
    ORCHESTRATOR,
    TRAINER,
    Workload,
)

TERMINAL = ("Succeeded", "Failed")
STALL_AFTER = dt.timedelta(minutes=15)
"""No step progress for this long marks the run not Progressing (the chart's alert uses the same)."""

_PHASE_OF = {
    "RUN_PHASE_UNSPECIFIED": "Pending",
    "RUN_PHASE_PENDING": "Pending",
    "RUN_PHASE_WARMUP": "Running",
    "RUN_PHASE_RUNNING": "Running",
    "RUN_PHASE_STOPPING": "Running",
    "RUN_PHASE_SUCCEEDED": "Succeeded",
    "RUN_PHASE_FAILED": "Failed",
}
_COMPONENT_CONDITIONS = (
    ("InferenceReady", INFERENCE),
    ("EnvServersReady", ENV_SERVER),
    ("TrainerReady", TRAINER),
)


def timestamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class OrchestratorReport:
    """The fields of `rlrun.v1.GetRunStatusResponse` the status uses."""

    phase: str = "RUN_PHASE_UNSPECIFIED"
    step: int = 0
    max_steps: int = 0
    policy_version: int = 0
    train_reward: float = 0.0
    eval_reward: float = 0.0
    off_policy_lag: int = 0
    tokens_per_s: float = 0.0
    last_error: str = ""
    groups_dropped_stale: int = 0

    @classmethod
    def from_proto(cls, message: Any) -> OrchestratorReport:
        from rlrun.v1 import orchestrator_pb2

        return cls(
            phase=orchestrator_pb2.RunPhase.Name(message.phase),
            step=message.step,
            max_steps=message.max_steps,
            policy_version=message.policy_version,
            train_reward=message.train_reward,
            eval_reward=message.eval_reward,
            off_policy_lag=message.off_policy_lag,
            tokens_per_s=message.tokens_per_s,
            last_error=message.last_error,
            groups_dropped_stale=message.groups_dropped_stale,
        )

    @property
    def run_phase(self) -> str:
        return _PHASE_OF.get(self.phase, "Pending")


@dataclass(frozen=True)
class WorkloadState:
    component: str
    name: str
    ready: int
    replicas: int
    min_ready: int

    @property
    def is_ready(self) -> bool:
        return self.ready >= self.min_ready


def workload_state(workload: Workload, live: dict[str, Any] | None) -> WorkloadState:
    """Readiness of one workload from its live object (None: not created yet)."""
    ready = int(((live or {}).get("status") or {}).get("readyReplicas") or 0)
    return WorkloadState(workload.component, workload.name, ready, workload.replicas, workload.min_ready)


@dataclass(frozen=True)
class PodState:
    """One of the run's pods: its container restarts, why its latest one stopped, and why it
    is not running when it is not (from the pod's conditions and container states, else from
    its newest Warning Event)."""

    component: str
    pod: str
    restarts: int
    reason: str = ""
    """`lastState.terminated.reason` (OOMKilled, Error, ...) of its latest terminated container."""
    exit_code: int | None = None
    finished_at: str = ""
    blocked: str = ""
    """Why it does not run, as Kubernetes says it: Unschedulable, CrashLoopBackOff,
    ImagePullBackOff, FailedMount, ... ("" while it runs or merely starts)."""
    detail: str = ""
    """The message that goes with `blocked`."""


_COMPONENT_ORDER = (INFERENCE, MODEL_SERVER, ENV_SERVER, ORCHESTRATOR, TRAINER)
_RESUMES = {
    TRAINER: "The trainer resumes from its newest complete checkpoint.",
    ORCHESTRATOR: "The orchestrator resumes from the state saved with the trainer's checkpoint.",
}
_STARTING = ("ContainerCreating", "PodInitializing")
"""Waiting reasons of a container that is on its way: nothing to explain."""


def _last_termination(containers: list[dict[str, Any]]) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for container in containers:
        terminated = (container.get("lastState") or {}).get("terminated") or {}
        if terminated and str(terminated.get("finishedAt") or "") >= str(last.get("finishedAt") or ""):
            last = terminated
    return last


def _why(terminated: dict[str, Any]) -> str:
    why = str(terminated.get("reason") or "unknown reason")
    if terminated.get("exitCode") is not None:
        why += f", exit code {terminated['exitCode']}"
    return why


def _container_blocked(containers: list[dict[str, Any]]) -> tuple[str, str]:
    """(reason, message) of the first container that waits for something other than its start."""
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if not reason or reason in _STARTING:
            continue
        if reason == "CrashLoopBackOff":
            last = (container.get("lastState") or {}).get("terminated") or {}
            message = f"container {container.get('name')} keeps exiting (last: {_why(last)})"
            if last.get("message"):
                message += f": {str(last['message']).strip()}"
            return reason, message
        return reason, f"container {container.get('name')}: {waiting.get('message') or reason}"
    return "", ""


def _unscheduled(status: dict[str, Any]) -> tuple[str, str]:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or "Unschedulable"), str(condition.get("message") or "")
    return "", ""


def _newest_warning(pod: str, events: Sequence[dict[str, Any]]) -> tuple[str, str]:
    mine = [
        e
        for e in events
        if e.get("type") == "Warning"
        and (e.get("involvedObject") or {}).get("kind") == "Pod"
        and (e.get("involvedObject") or {}).get("name") == pod
    ]
    if not mine:
        return "", ""
    newest = max(mine, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return str(newest.get("reason") or ""), str(newest.get("message") or "")


def pod_state(pod: dict[str, Any], events: Sequence[dict[str, Any]] = ()) -> PodState | None:
    """The state of one live Pod, `events` being its namespace's Events (None for a pod that
    is none of the run's components)."""
    meta = pod.get("metadata") or {}
    component = (meta.get("labels") or {}).get("app.kubernetes.io/component")
    if component not in _COMPONENT_ORDER:
        return None
    name = str(meta.get("name") or "")
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    last = _last_termination(status.get("containerStatuses") or [])
    blocked, detail = _container_blocked(containers)
    if not blocked:
        blocked, detail = _unscheduled(status)
    if not blocked and status.get("phase", "Pending") == "Pending":
        # Kubelet-side trouble before any container exists (FailedMount, FailedAttachVolume,
        # FailedCreatePodSandBox) shows in Events only.
        blocked, detail = _newest_warning(name, events)
    return PodState(
        component,
        name,
        restarts,
        str(last.get("reason") or ""),
        last.get("exitCode"),
        str(last.get("finishedAt") or ""),
        blocked,
        detail,
    )


def _restarts(pods: list[PodState]) -> tuple[dict[str, int] | None, str]:
    """(restarts per component, None without pods; what restarted and why, "" if nothing)."""
    counts: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: _COMPONENT_ORDER.index(p.component)):
        counts[pod.component] = counts.get(pod.component, 0) + pod.restarts
    parts, resumes = [], []
    for component in [c for c, n in counts.items() if n]:
        latest = max(
            (p for p in pods if p.component == component and p.restarts),
            key=lambda p: p.finished_at,
        )
        why = _why({"reason": latest.reason, "exitCode": latest.exit_code})
        when = f" at {latest.finished_at}" if latest.finished_at else ""
        count = counts[component]
        parts.append(
            f"{component}: {count} restart{'s' if count > 1 else ''} (last {latest.pod}: {why}{when})"
        )
        if component in _RESUMES:
            resumes.append(_RESUMES[component])
    message = " ".join(["; ".join(parts) + "." if parts else "", *resumes]).strip()
    return (counts or None), message


@dataclass
class Observation:
    generation: int
    now: dt.datetime
    error: str | None = None
    """The spec or config error, when the run cannot be reconciled."""
    suspended: bool = False
    workloads: list[WorkloadState] = field(default_factory=list)
    polled: bool = False
    """Whether the orchestrator was asked this time (False: keep its previous answer)."""
    report: OrchestratorReport | None = None
    poll_error: str | None = None
    pods: list[PodState] | None = None
    """The run's pods (None: not observed this time, so the previous restarts are kept)."""
    admission: Admission | None = None
    """Kueue's admission of a queued run's pod group (None: the run has no spec.queueName)."""
    apply_errors: list[str] = field(default_factory=list)
    """The run's objects the API server refused this time ("Kind/name: message")."""


def is_finished(status: dict[str, Any] | None) -> bool:
    status = status or {}
    return bool(status.get("completionTime")) and status.get("phase") in TERMINAL


def ttl_expired(status: dict[str, Any] | None, ttl_seconds: int | None, now: dt.datetime) -> bool:
    if ttl_seconds is None or not is_finished(status):
        return False
    done = parse_timestamp((status or {}).get("completionTime"))
    return done is not None and now >= done + dt.timedelta(seconds=ttl_seconds)


def _finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def _phase(previous: dict[str, Any], obs: Observation, finished_before: bool) -> str:
    if obs.error is not None:
        return "Failed"
    if finished_before:
        return previous["phase"]
    if obs.suspended:
        return "Suspended"
    if obs.polled:
        if obs.report is not None:
            return obs.report.run_phase
        return "Running" if previous.get("phase") == "Running" else "Pending"
    return previous.get("phase") if previous.get("phase") in ("Pending", "Running") else "Pending"


def _condition(
    previous: dict[str, dict[str, Any]],
    kind: str,
    ok: bool | None,
    reason: str,
    message: str,
    obs: Observation,
) -> dict[str, Any]:
    """A condition; its lastTransitionTime moves only when its status changes."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    before = previous.get(kind)
    changed = before is None or before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": timestamp(obs.now)
        if changed
        else before.get("lastTransitionTime", timestamp(obs.now)),
        "observedGeneration": obs.generation,
    }


_CARRIED = (
    "step",
    "maxSteps",
    "policyVersion",
    "reward",
    "evalReward",
    "offPolicyLag",
    "tokensPerSecond",
    "groupsDroppedStale",
    "lastError",
    "startTime",
    "completionTime",
    "lastProgressTime",
)
"""Status keys that keep their value until an observation changes them."""


def _orchestrator_fields(
    previous: dict[str, Any], report: OrchestratorReport | None, now: dt.datetime
) -> dict[str, Any]:
    """The status keys the orchestrator's answer sets (none without an answer)."""
    if report is None:
        return {}
    fields: dict[str, Any] = dict(
        step=report.step,
        maxSteps=report.max_steps,
        policyVersion=report.policy_version,
        reward=_finite(report.train_reward),
        evalReward=_finite(report.eval_reward),
        offPolicyLag=report.off_policy_lag,
        tokensPerSecond=_finite(report.tokens_per_s),
        groupsDroppedStale=report.groups_dropped_stale,
        lastError=report.last_error or None,
    )
    if previous.get("step") is None or report.step > int(previous.get("step") or 0):
        fields["lastProgressTime"] = timestamp(now)
    return fields


def _times(status: dict[str, Any], phase: str, report: OrchestratorReport | None, now: dt.datetime) -> None:
    if phase == "Running" and not status.get("startTime"):
        status["startTime"] = timestamp(now)
        status["lastProgressTime"] = status.get("lastProgressTime") or timestamp(now)
    if phase in TERMINAL and report is not None and not status.get("completionTime"):
        status["completionTime"] = timestamp(now)


def _config_condition(obs: Observation) -> tuple[str, bool, str, str]:
    if obs.error is not None:
        return ("ConfigValid", False, "InvalidConfig", obs.error)
    return ("ConfigValid", True, "Valid", "spec and run config are valid")


def _blocked_pods(obs: Observation, component: str) -> list[PodState]:
    # Fixed model servers are inference workloads (InferenceReady) with pods of their own label.
    components = (INFERENCE, MODEL_SERVER) if component == INFERENCE else (component,)
    return [p for p in obs.pods or [] if p.component in components and p.blocked]


def _component_condition(
    obs: Observation, kind: str, component: str, phase: str, finished: bool
) -> tuple[str, bool, str, str]:
    """Whether a component's workloads are ready; when not, why, as its pods say."""
    states = [w for w in obs.workloads if w.component == component]
    if obs.error is not None:
        return (kind, False, "InvalidConfig", "nothing is deployed")
    if finished:
        return (kind, False, "Finished", f"the run {phase.lower()}")
    if obs.suspended:
        return (kind, False, "Suspended", "the run is suspended")
    if not states:
        return (kind, True, "External", "served outside this run")
    message = ", ".join(f"{w.name}: {w.ready}/{w.replicas} ready" for w in states)
    if all(w.is_ready for w in states):
        return (kind, True, "Ready", message)
    blocked = _blocked_pods(obs, component)
    if not blocked:
        return (kind, False, "NotReady", message)
    why = "; ".join(f"pod {p.pod}: {p.blocked}: {p.detail}".rstrip(": ") for p in blocked)
    return (kind, False, blocked[0].blocked, f"{message}; {why}")


def _progressing_condition(
    status: dict[str, Any], phase: str, now: dt.datetime
) -> tuple[str, bool, str, str]:
    if phase != "Running":
        return ("Progressing", False, phase, f"the run is {phase.lower()}")
    last_progress = parse_timestamp(status.get("lastProgressTime"))
    if last_progress is not None and now - last_progress >= STALL_AFTER:
        minutes = int((now - last_progress).total_seconds() // 60)
        return ("Progressing", False, "Stalled", f"no step progress for {minutes} min")
    step = status.get("step")
    message = f"step {step}/{status.get('maxSteps')}" if step is not None else "running"
    return ("Progressing", True, "StepAdvancing", message)


SECRET_HINT = (
    " (the operator may write Secrets only in the namespaces of the chart's operator.runNamespaces:"
    " add this namespace there)"
)


def _apply_failure(errors: list[str]) -> str:
    message = "; ".join(errors)
    if any(e.startswith("Secret/") and "forbidden" in e for e in errors):
        message += SECRET_HINT
    return message


def _degraded_condition(
    status: dict[str, Any], phase: str, obs: Observation, not_ready: list[tuple[str, str]]
) -> tuple[str, bool, str, str]:
    if obs.apply_errors:
        return ("Degraded", True, "ApplyFailed", _apply_failure(obs.apply_errors))
    if phase == "Running" and obs.polled and obs.report is None:
        return (
            "Degraded",
            True,
            "OrchestratorUnreachable",
            obs.poll_error or "the orchestrator status API does not answer",
        )
    if phase == "Running" and not_ready:
        names = ", ".join(
            f"{name} ({reason})" if reason != "NotReady" else name for name, reason in not_ready
        )
        return ("Degraded", True, "ComponentsNotReady", "not ready: " + names)
    if phase in ("Running", "Failed") and status.get("lastError"):
        return ("Degraded", True, "RunError", str(status["lastError"]))
    if obs.error is not None:
        return ("Degraded", True, "InvalidConfig", obs.error)
    return ("Degraded", False, "Healthy", "")


def _message(status: dict[str, Any], phase: str, obs: Observation) -> str:
    if obs.error is not None:
        return obs.error
    if phase == "Suspended":
        return "suspended: pods deleted, storage kept"
    if phase in TERMINAL:
        return status.get("lastError") or f"run {phase.lower()} at step {status.get('step')}"
    if phase == "Running":
        return f"step {status.get('step')}/{status.get('maxSteps')}"
    if obs.admission is not None and not obs.admission.admitted:
        return f"waiting for Kueue to admit the run: {obs.admission.message}"
    return "waiting for the services to start"


def build_status(previous: dict[str, Any] | None, obs: Observation) -> dict[str, Any]:
    """The whole new status (camelCase keys; a None value means "remove the key")."""
    previous = dict(previous or {})
    finished_before = obs.error is None and is_finished(previous)
    phase = _phase(previous, obs, finished_before)
    report = obs.report if (obs.polled and not finished_before) else None
    status: dict[str, Any] = {key: previous.get(key) for key in _CARRIED}
    status.update(phase=phase, observedGeneration=obs.generation)
    status.update(_orchestrator_fields(previous, report, obs.now))
    _times(status, phase, report, obs.now)
    finished = finished_before or bool(status.get("completionTime"))

    found = [_config_condition(obs)]
    not_ready: list[tuple[str, str]] = []
    for kind, component in _COMPONENT_CONDITIONS:
        condition = _component_condition(obs, kind, component, phase, finished)
        found.append(condition)
        if not condition[1]:  # only counted while Running, when nothing else makes it False
            not_ready.append((kind.removesuffix("Ready"), condition[2]))
    if obs.admission is not None and not (finished or obs.suspended or obs.error):
        found.append(("Admitted", obs.admission.admitted, obs.admission.reason, obs.admission.message))
    found.append(_progressing_condition(status, phase, obs.now))
    found.append(_degraded_condition(status, phase, obs, not_ready))
    before = {c["type"]: c for c in previous.get("conditions") or []}
    conditions = [_condition(before, *condition, obs) for condition in found]

    if obs.pods is not None:
        status["restarts"], restarted = _restarts(obs.pods)
        reason = "ContainersRestarted" if restarted else "NoRestarts"
        message = restarted or "no container of the run has restarted"
        conditions.append(_condition(before, "Restarted", bool(restarted), reason, message, obs))
    else:
        # Pods not observed this time: keep what was seen last.
        status["restarts"] = previous.get("restarts")
        if "Restarted" in before:
            conditions.append(before["Restarted"])
    status["conditions"] = conditions
    status["message"] = _message(status, phase, obs)
    return status


def compact(status: dict[str, Any]) -> dict[str, Any]:
    """`status` without None values (what the API server would store)."""
    return {k: v for k, v in status.items() if v is not None}


def status_patch(previous: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from `previous` to `new`: changed keys, and None for removed ones (also
    inside a map such as `restarts`, which a merge patch merges key by key)."""
    previous = previous or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = previous.get(key)
        if value is None:
            if before is not None:
                patch[key] = None
        elif isinstance(value, dict) and isinstance(before, dict):
            removed = {k: None for k in before if k not in value}
            changed = status_patch(before, value) | removed
            if changed:
                patch[key] = changed
        elif before != value:
            patch[key] = value
    return patch


def transition_events(previous: dict[str, Any] | None, new: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Kubernetes Events (type, reason, message) for what changed between two statuses."""
    previous = previous or {}
    events: list[tuple[str, str, str]] = []
    if previous.get("phase") != new.get("phase"):
        kind = "Warning" if new.get("phase") == "Failed" else "Normal"
        events.append(
            (
                kind,
                new["phase"],
                f"phase {previous.get('phase') or 'None'} -> {new['phase']}: {new.get('message') or ''}".strip(),
            )
        )
    before = {c["type"]: c for c in previous.get("conditions") or []}
    for condition in new.get("conditions") or []:
        if condition["type"] == "Restarted":
            continue  # an event for every restart, below
        old = before.get(condition["type"])
        if old is not None and old.get("status") == condition["status"]:
            continue
        bad = (condition["type"] == "Degraded" and condition["status"] == "True") or (
            condition["type"] in ("ConfigValid", "Progressing")
            and condition["status"] == "False"
            and condition["reason"] in ("InvalidConfig", "Stalled")
        )
        if old is None and not bad:
            continue  # the first status: only problems are worth an event
        events.append(
            (
                "Warning" if bad else "Normal",
                condition["reason"] or condition["type"],
                f"{condition['type']}={condition['status']}: {condition['message']}".rstrip(": "),
            )
        )
    counts_before = previous.get("restarts") or {}
    counts = new.get("restarts") or {}
    if any(count > int(counts_before.get(component) or 0) for component, count in counts.items()):
        restarted = next(c for c in new["conditions"] if c["type"] == "Restarted")
        events.append(("Warning", "Restarted", restarted["message"]))
    return events
