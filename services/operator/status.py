"""Pure status mapping: what the operator observed -> `RLRun.status`.

Inputs are the previous status, the readiness of the run's workloads, the container restarts
of its pods and (when polled) the orchestrator's `GetStatus` answer. Output is the whole new
status: `phase` (Pending, Running, Succeeded, Failed, Suspended), the conditions ConfigValid,
InferenceReady, EnvServersReady, TrainerReady, Admitted (queued runs: Kueue's admission of the
run's pod group), Progressing, Degraded and Restarted,
`observedGeneration`, step, policy version, rewards, `lastError` and `restarts` per component.
A run becomes finished (`completionTime` set) only when the orchestrator reports it succeeded
or failed; that is sticky, and it is what frees the GPUs and starts `ttlSecondsAfterFinished`.

`next_status` builds the typed `RLRunStatus` (rlrun.operator.spec, the CRD's own schema) from
the previous one; `build_status` is the same on the CRD's dicts (`RLRunStatus.from_crd` /
`to_crd`, the one conversion). What the pods say about themselves (restarts, crash loops,
image pulls, unschedulable pods) is read in rlrun.operator.pods.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.operator.kueue import Admission
from rlrun.operator.pods import PodState, blocked_pods, restart_summary
from rlrun.operator.reconcile import ENV_SERVER, INFERENCE, TRAINER, Workload
from rlrun.operator.spec import Condition, RLRunStatus

TERMINAL = ("Succeeded", "Failed")
STALL_AFTER = dt.timedelta(minutes=15)
"""No step progress for this long marks the run not Progressing (the chart's alert uses the same)."""

_PHASE_OF = {
    "": "Pending",
    "pending": "Pending",
    "warmup": "Running",
    "running": "Running",
    "stopping": "Running",
    "succeeded": "Succeeded",
    "failed": "Failed",
}
"""The RLRun phase of each phase the orchestrator reports (rlrun.common.wire.orchestrator)."""
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
    report: RunStatus | None = None
    """The orchestrator's `GetStatus` answer (None: it did not answer, or was not asked)."""
    poll_error: str | None = None
    pods: list[PodState] | None = None
    """The run's pods (None: not observed this time, so the previous restarts are kept)."""
    admission: Admission | None = None
    """Kueue's admission of a queued run's pod group (None: the run has no spec.queueName)."""
    apply_errors: list[str] = field(default_factory=list)
    """The run's objects the API server refused this time ("Kind/name: message")."""


def finished(status: RLRunStatus) -> bool:
    return bool(status.completion_time) and status.phase in TERMINAL


def is_finished(status: dict[str, Any] | None) -> bool:
    return finished(RLRunStatus.from_crd(status))


def ttl_expired(status: dict[str, Any] | None, ttl_seconds: int | None, now: dt.datetime) -> bool:
    typed = RLRunStatus.from_crd(status)
    if ttl_seconds is None or not finished(typed):
        return False
    done = parse_timestamp(typed.completion_time)
    return done is not None and now >= done + dt.timedelta(seconds=ttl_seconds)


def _finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


def _run_phase(report: RunStatus) -> str:
    return _PHASE_OF.get(report.phase, "Pending")


def _phase(previous: RLRunStatus, obs: Observation, finished_before: bool) -> str:
    if obs.error is not None:
        return "Failed"
    if finished_before:
        return str(previous.phase)
    if obs.suspended:
        return "Suspended"
    if obs.polled:
        if obs.report is not None:
            return _run_phase(obs.report)
        return "Running" if previous.phase == "Running" else "Pending"
    return str(previous.phase) if previous.phase in ("Pending", "Running") else "Pending"


Found = tuple[str, bool | None, str, str]
"""A condition as found this time: (type, ok (None: unknown), reason, message)."""


def _condition(previous: dict[str, Condition], found: Found, obs: Observation) -> Condition:
    """A condition; its lastTransitionTime moves only when its status changes."""
    kind, ok, reason, message = found
    status = "Unknown" if ok is None else ("True" if ok else "False")
    before = previous.get(kind)
    kept = before.last_transition_time if before is not None and before.status == status else None
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=kept or timestamp(obs.now),
        observed_generation=obs.generation,
    )


def _orchestrator_fields(previous: RLRunStatus, report: RunStatus | None, now: dt.datetime) -> dict[str, Any]:
    """The status fields the orchestrator's answer sets (none without an answer)."""
    if report is None:
        return {}
    fields: dict[str, Any] = dict(
        step=report.step,
        max_steps=report.max_steps,
        policy_version=report.version,
        reward=_finite(report.train_reward),
        eval_reward=_finite(report.eval_reward),
        off_policy_lag=report.off_policy_lag,
        tokens_per_second=_finite(report.tokens_per_s),
        groups_dropped_stale=report.groups_dropped_stale,
        last_error=report.last_error or None,
    )
    if previous.step is None or report.step > previous.step:
        fields["last_progress_time"] = timestamp(now)
    return fields


def _times(status: RLRunStatus, report: RunStatus | None, now: dt.datetime) -> None:
    if status.phase == "Running" and not status.start_time:
        status.start_time = timestamp(now)
        status.last_progress_time = status.last_progress_time or timestamp(now)
    if status.phase in TERMINAL and report is not None and not status.completion_time:
        status.completion_time = timestamp(now)


def _config_condition(obs: Observation) -> Found:
    if obs.error is not None:
        return ("ConfigValid", False, "InvalidConfig", obs.error)
    return ("ConfigValid", True, "Valid", "spec and run config are valid")


def _component_condition(obs: Observation, kind: str, component: str, phase: str, finished: bool) -> Found:
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
    blocked = blocked_pods(obs.pods or [], component)
    if not blocked:
        return (kind, False, "NotReady", message)
    why = "; ".join(f"pod {p.pod}: {p.blocked}: {p.detail}".rstrip(": ") for p in blocked)
    return (kind, False, blocked[0].blocked, f"{message}; {why}")


def _progressing_condition(status: RLRunStatus, now: dt.datetime) -> Found:
    phase = str(status.phase)
    if phase != "Running":
        return ("Progressing", False, phase, f"the run is {phase.lower()}")
    last_progress = parse_timestamp(status.last_progress_time)
    if last_progress is not None and now - last_progress >= STALL_AFTER:
        minutes = int((now - last_progress).total_seconds() // 60)
        return ("Progressing", False, "Stalled", f"no step progress for {minutes} min")
    step = status.step
    message = f"step {step}/{status.max_steps}" if step is not None else "running"
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


def _degraded_condition(status: RLRunStatus, obs: Observation, not_ready: list[tuple[str, str]]) -> Found:
    phase = status.phase
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
    if phase in ("Running", "Failed") and status.last_error:
        return ("Degraded", True, "RunError", status.last_error)
    if obs.error is not None:
        return ("Degraded", True, "InvalidConfig", obs.error)
    return ("Degraded", False, "Healthy", "")


def _message(status: RLRunStatus, obs: Observation) -> str:
    phase = str(status.phase)
    if obs.error is not None:
        return obs.error
    if phase == "Suspended":
        return "suspended: pods deleted, storage kept"
    if phase in TERMINAL:
        return status.last_error or f"run {phase.lower()} at step {status.step}"
    if phase == "Running":
        return f"step {status.step}/{status.max_steps}"
    if obs.admission is not None and not obs.admission.admitted:
        return f"waiting for Kueue to admit the run: {obs.admission.message}"
    return "waiting for the services to start"


def _found_conditions(status: RLRunStatus, obs: Observation, finished: bool) -> list[Found]:
    """Every condition but Restarted, as this observation finds it."""
    phase = str(status.phase)
    found = [_config_condition(obs)]
    not_ready: list[tuple[str, str]] = []
    for kind, component in _COMPONENT_CONDITIONS:
        condition = _component_condition(obs, kind, component, phase, finished)
        found.append(condition)
        if not condition[1]:  # only counted while Running, when nothing else makes it False
            not_ready.append((kind.removesuffix("Ready"), condition[2]))
    if obs.admission is not None and not (finished or obs.suspended or obs.error):
        found.append(("Admitted", obs.admission.admitted, obs.admission.reason, obs.admission.message))
    found.append(_progressing_condition(status, obs.now))
    found.append(_degraded_condition(status, obs, not_ready))
    return found


def next_status(previous: RLRunStatus, obs: Observation) -> RLRunStatus:
    """The whole new status. What no observation changes this time (the orchestrator's numbers
    between polls, the restarts while the pods cannot be listed) keeps its previous value."""
    finished_before = obs.error is None and finished(previous)
    report = obs.report if (obs.polled and not finished_before) else None
    status = previous.model_copy(
        update={
            "phase": _phase(previous, obs, finished_before),
            "observed_generation": obs.generation,
            **_orchestrator_fields(previous, report, obs.now),
        },
        deep=True,
    )
    _times(status, report, obs.now)
    before = {c.type: c for c in previous.conditions}
    found = _found_conditions(status, obs, finished_before or bool(status.completion_time))
    conditions = [_condition(before, condition, obs) for condition in found]
    if obs.pods is not None:
        status.restarts, restarted = restart_summary(obs.pods)
        reason = "ContainersRestarted" if restarted else "NoRestarts"
        message = restarted or "no container of the run has restarted"
        conditions.append(_condition(before, ("Restarted", bool(restarted), reason, message), obs))
    elif "Restarted" in before:
        conditions.append(before["Restarted"])  # pods not observed this time: keep what was seen last
    status.conditions = conditions
    status.message = _message(status, obs)
    return RLRunStatus.model_validate(status.model_dump())  # checked once, as the CRD will


def build_status(previous: dict[str, Any] | None, obs: Observation) -> dict[str, Any]:
    """The whole new status as the CRD holds it (camelCase keys; a None value means "remove
    the key")."""
    return next_status(RLRunStatus.from_crd(previous), obs).to_crd()


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
    before, after = RLRunStatus.from_crd(previous), RLRunStatus.from_crd(new)
    events: list[tuple[str, str, str]] = []
    if before.phase != after.phase:
        kind = "Warning" if after.phase == "Failed" else "Normal"
        message = f"phase {before.phase or 'None'} -> {after.phase}: {after.message or ''}"
        events.append((kind, str(after.phase), message.strip()))
    events += _condition_events(before, after)
    counts_before = before.restarts or {}
    if any(
        count > (counts_before.get(component) or 0) for component, count in (after.restarts or {}).items()
    ):
        restarted = next(c for c in after.conditions if c.type == "Restarted")
        events.append(("Warning", "Restarted", restarted.message))
    return events


def _condition_events(before: RLRunStatus, after: RLRunStatus) -> list[tuple[str, str, str]]:
    """An Event for each condition that changed; on the first status, only for problems."""
    old_of = {c.type: c for c in before.conditions}
    events = []
    for condition in after.conditions:
        if condition.type == "Restarted":
            continue  # an event for every restart (transition_events)
        old = old_of.get(condition.type)
        if old is not None and old.status == condition.status:
            continue
        bad = (condition.type == "Degraded" and condition.status == "True") or (
            condition.type in ("ConfigValid", "Progressing")
            and condition.status == "False"
            and condition.reason in ("InvalidConfig", "Stalled")
        )
        if old is None and not bad:
            continue  # the first status: only problems are worth an event
        events.append(
            (
                "Warning" if bad else "Normal",
                condition.reason or condition.type,
                f"{condition.type}={condition.status}: {condition.message}".rstrip(": "),
            )
        )
    return events
