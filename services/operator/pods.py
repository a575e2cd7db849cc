"""Pod diagnostics: what a run's live Pods say about themselves, for the status.

`pod_state` reads one Pod (and its namespace's Events) into a `PodState`: its container
restarts and why the latest one stopped (OOMKilled, Error, an exit code), and why it does not
run when it does not: a crash loop, an image pull, no node that fits (Unschedulable), or
kubelet-side trouble that only Events show (FailedMount, FailedAttachVolume, ...).
`restart_summary` adds the restarts up per component and says what restarted last and why.
rlrun.operator.status turns both into conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlrun.operator.builder import ENV_SERVER, INFERENCE, MODEL_SERVER, ORCHESTRATOR, TRAINER


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


COMPONENT_ORDER = (INFERENCE, MODEL_SERVER, ENV_SERVER, ORCHESTRATOR, TRAINER)
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
    if component not in COMPONENT_ORDER:
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


def blocked_pods(pods: Sequence[PodState], component: str) -> list[PodState]:
    """The pods of `component` that do not run, and why."""
    # Fixed model servers are inference workloads (InferenceReady) with pods of their own label.
    components = (INFERENCE, MODEL_SERVER) if component == INFERENCE else (component,)
    return [p for p in pods if p.component in components and p.blocked]


def restart_summary(pods: list[PodState]) -> tuple[dict[str, int] | None, str]:
    """(restarts per component, None without pods; what restarted and why, "" if nothing)."""
    counts: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: COMPONENT_ORDER.index(p.component)):
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
