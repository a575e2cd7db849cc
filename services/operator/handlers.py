"""kopf handlers for RLRun, kept thin: every decision lives in `reconcile` and `status`.

- create / update / resume: server-side apply the desired objects (what is missing or changed),
  delete what is no longer wanted, read the run's pods (restarts, and why one does not run)
  and write the status;
- a timer: the same, plus one `OrchestratorService.GetStatus` call, so drift is repaired and
  phase, step, policy version and reward stay current; it also enforces
  `ttlSecondsAfterFinished`;
- delete: removes the children (owner references would too, through the garbage collector),
  then kopf releases the finalizer `rlrun.dev/finalizer`;
- a liveness probe (`rlrun operator --liveness-port`); every pass is counted and timed in the
  operator's metrics (`rlrun.operator.metrics`), with each run's phase.

`build_registry(options)` returns a fresh registry, so tests run the real handlers against a
real API server (tests/support/kubecluster) with a stand-in orchestrator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from rlrun.common.wire.orchestrator import RunStatus
from rlrun.operator import kueue
from rlrun.operator.auth import run_credentials
from rlrun.operator.config import Cluster, auth_secret_name
from rlrun.operator.kube import (
    ApplyResult,
    Kube,
    KubeError,
    apply_objects,
    list_owned,
    prune_objects,
)
from rlrun.operator.metrics import OperatorMetrics
from rlrun.operator.pods import PodState, pod_state
from rlrun.operator.reconcile import RUN_LABEL, Defaults, DesiredState, desired_state, pod_group_name
from rlrun.operator.spec import FINALIZER, GROUP, PLURAL, VERSION
from rlrun.operator.status import (
    Observation,
    build_status,
    is_finished,
    status_patch,
    transition_events,
    ttl_expired,
    workload_state,
)
from rlrun.operator.status_client import client_options, fetch_status

log = logging.getLogger("rlrun.operator")

DEFAULT_STATUS_ADDRESS = "{name}-orchestrator.{namespace}.svc.{domain}:50051"


def default_api_client() -> Any:
    """An ApiClient from the in-cluster service account, else from the kubeconfig."""
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


@dataclass
class OperatorOptions:
    defaults: Defaults = field(default_factory=Defaults)
    status_interval_s: float = 10.0
    """How often each run's status is polled (and its objects re-checked)."""
    status_timeout_s: float = 3.0
    status_address: str = DEFAULT_STATUS_ADDRESS
    """Where the orchestrator's status API is, with {name}, {namespace} and {domain}."""
    api_client_factory: Callable[[], Any] = default_api_client
    login: Callable[[], kopf.ConnectionInfo] | None = None
    """A kopf login override (tests); None uses kopf's own (in-cluster or kubeconfig)."""
    grpc_tls_ca: Path | None = None
    """CA that signed the certificates of runs with spec.secrets.tls (the status poll checks the
    orchestrator against it). The operator reads no run's Secret."""
    grpc_tls_cert: Path | None = None
    grpc_tls_key: Path | None = None
    """The operator's own client certificate, for runs whose servers require one."""
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    """What `rlrun operator --metrics-port` serves."""


def configure_settings(settings: kopf.OperatorSettings, options: OperatorOptions) -> kopf.OperatorSettings:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # The operator needs no cluster-wide CRD or Namespace access: the CRD is installed first.
    settings.scanning.disabled = True
    # Events come from kopf.event() on transitions, not from every log line of every tick.
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    # On deletion kopf re-checks a stopping status timer this often before it releases the
    # finalizer (its default, 60 s, would hold every deleted run for a minute).
    settings.background.cancellation_polling = min(5.0, max(0.1, options.status_interval_s))
    return settings


class _Runtime:
    def __init__(self, options: OperatorOptions):
        self.options = options
        self._kube: Kube | None = None
        self._lock = threading.Lock()
        self.runs: set[tuple[str, str]] = set()
        self._passes: dict[tuple[str, str], asyncio.Lock] = {}

    def pass_lock(self, meta: Any) -> asyncio.Lock:
        """One pass at a time per run. kopf runs the status timer beside the change handlers:
        two passes of a new run would each find its children missing and apply every one twice."""
        return self._passes.setdefault((meta.get("namespace"), meta.get("name")), asyncio.Lock())

    def forget(self, meta: Any) -> None:
        self.runs.discard((meta.get("namespace"), meta.get("name")))
        self._passes.pop((meta.get("namespace"), meta.get("name")), None)

    @property
    def kube(self) -> Kube:
        with self._lock:
            if self._kube is None:
                self._kube = Kube(self.options.api_client_factory())
            return self._kube


def _plain(body: Any) -> dict[str, Any]:
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": dict(body.get("metadata") or {}),
        "spec": _to_dict(body.get("spec") or {}),
        "status": _to_dict(body.get("status") or {}),
    }


def _to_dict(value: Any) -> Any:
    if hasattr(value, "items"):
        return {k: _to_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_dict(v) for v in value]
    return value


async def _report(runtime: _Runtime, run: dict[str, Any], spec: Any) -> tuple[RunStatus | None, str | None]:
    options = runtime.options
    meta = run["metadata"]
    address = options.status_address.format(
        name=meta["name"], namespace=meta["namespace"], domain=options.defaults.cluster_domain
    )
    try:
        token = run_credentials(
            options.defaults.token_key, meta["namespace"], meta["name"], meta["uid"]
        ).token
        client = client_options(
            options.status_timeout_s,
            token,
            tls=spec.secrets.tls is not None,
            ca=options.grpc_tls_ca,
            cert=options.grpc_tls_cert,
            key=options.grpc_tls_key,
        )
        return await fetch_status(address, options.status_timeout_s, client), None
    except Exception as error:  # noqa: BLE001 - any failure means "no answer this time"
        details = getattr(error, "details", None)
        message = details() if callable(details) else str(error)
        return None, f"orchestrator {address}: {message or type(error).__name__}"


def _pods(runtime: _Runtime, run: dict[str, Any], logger: logging.Logger) -> list[PodState] | None:
    """The states of the run's pods; None when they cannot be listed (the status then keeps
    the previous restarts rather than failing the whole sync). The namespace's pod Events are
    read only while some pod is Pending, the one case where they hold the reason."""
    meta = run["metadata"]
    kube = runtime.kube
    try:
        pods = kube.list("v1", "Pod", meta["namespace"], {RUN_LABEL: meta["name"]})
    except KubeError as error:
        logger.warning("cannot list the run's pods: %s", error)
        return None
    events: list[dict[str, Any]] = []
    if any((pod.get("status") or {}).get("phase", "Pending") == "Pending" for pod in pods):
        try:
            events = kube.list("v1", "Event", meta["namespace"], {}, fields={"involvedObject.kind": "Pod"})
        except KubeError as error:
            logger.warning("cannot list the namespace's events: %s", error)
    return [state for state in (pod_state(pod, events) for pod in pods) if state is not None]


def _admission(runtime: _Runtime, run: dict[str, Any], logger: logging.Logger) -> kueue.Admission | None:
    """Kueue's word on a queued run's pod group (None for a run without spec.queueName)."""
    if not (run["spec"] or {}).get("queueName"):
        return None
    meta = run["metadata"]
    group = pod_group_name(Cluster(meta["name"], meta["namespace"]))
    kube = runtime.kube
    try:
        workload = kube.get(*kueue.WORKLOAD_API, meta["namespace"], group)
        pods = kube.list("v1", "Pod", meta["namespace"], {kueue.GROUP_NAME_LABEL: group})
    except KubeError as error:
        # Without Kueue's CRD the Workload kind does not exist (404 is None above): only a real
        # failure lands here, and the inference replicas stay held until the next pass.
        logger.warning("cannot read the run's Kueue Workload: %s", error)
        return kueue.Admission(False, "WorkloadUnknown", str(error))
    return kueue.admission(workload, pods)


def _release_gang(runtime: _Runtime, run: dict[str, Any], result: ApplyResult) -> None:
    """Deletes the run's Kueue Workload once its pod group is no longer wanted (suspended,
    finished, no queue any more). Kueue keeps a serving pod group's Workload, its quota and
    the `kueue.x-k8s.io/managed` finalizer of every pod after the pods' StatefulSets and
    Deployments are gone (seen with Kueue v0.17: the pods stay Terminating, the quota stays
    reserved); deleting the Workload releases both."""
    meta = run["metadata"]
    group = pod_group_name(Cluster(meta["name"], meta["namespace"]))
    try:
        if runtime.kube.delete(*kueue.WORKLOAD_API, meta["namespace"], group):
            result.deleted.append(f"Workload/{group}")
    except KubeError as error:
        result.failed.append(f"Workload/{group}: {error.message}")


def _apply(runtime: _Runtime, run: dict[str, Any], objects: list[dict[str, Any]]) -> ApplyResult:
    kube = runtime.kube
    meta = run["metadata"]
    # The run's objects, listed once for both steps (a list per kind, not a GET per object).
    owned = list_owned(kube, meta["name"], meta["namespace"])
    result = apply_objects(kube, objects, owned)
    return prune_objects(
        kube, meta["name"], meta["namespace"], meta["uid"], objects, result=result, owned=owned
    )


async def _apply_state(
    runtime: _Runtime, run: dict[str, Any], body: Any, state: DesiredState, finished: bool, handler: str
) -> tuple[dict[Any, Any], list[str]]:
    """Applies the desired objects, deletes those no longer wanted (a queued run's Kueue
    Workload too, once its pod group is not wanted) and posts what changed as Events. Returns
    (the live objects, the objects the API server refused)."""
    options = runtime.options
    try:
        result = await asyncio.to_thread(_apply, runtime, run, state.objects)
    except KubeError as error:
        raise kopf.TemporaryError(
            f"cannot reach the API: {error}", delay=options.status_interval_s
        ) from error
    spec = state.spec
    assert spec is not None  # a state without an error has its spec
    queued_before = any(c.get("type") == "Admitted" for c in run["status"].get("conditions") or [])
    gang_wanted = bool(spec.queue_name) and not (spec.suspend or finished)
    if (spec.queue_name or queued_before) and not gang_wanted:
        await asyncio.to_thread(_release_gang, runtime, run, result)
    if result.changed:
        summary = "; ".join(
            f"{what} {', '.join(items)}"
            for what, items in (
                ("created", result.created),
                ("updated", result.updated),
                ("deleted", result.deleted),
            )
            if items
        )
        kopf.event(body, type="Normal", reason="Reconciled", message=summary[:1000])
    for failure in result.failed:
        kopf.event(body, type="Warning", reason="ApplyFailed", message=failure[:1000])
    if result.failed:
        options.metrics.error(handler, "apply")
    return result.live, result.failed


async def sync(runtime: _Runtime, body: Any, patch: kopf.Patch, logger: logging.Logger, poll: bool) -> None:
    """One reconcile pass (counted and timed in the operator's metrics); writes the whole
    status through `patch`."""
    handler = "status" if poll else "reconcile"
    with runtime.options.metrics.timed(handler):
        await _sync(runtime, body, patch, logger, poll, handler)


async def _sync(
    runtime: _Runtime, body: Any, patch: kopf.Patch, logger: logging.Logger, poll: bool, handler: str
) -> None:
    options = runtime.options
    run = _plain(body)
    meta, previous = run["metadata"], run["status"]
    finished = is_finished(previous)
    admission = await asyncio.to_thread(_admission, runtime, run, logger) if not finished else None
    admitted = admission is None or admission.admitted
    state = desired_state(run, options.defaults, finished=finished, gang_admitted=admitted)
    report = poll_error = None
    polled = False
    if poll and state.error is None and not finished and not state.spec.suspend:
        polled = True
        report, poll_error = await _report(runtime, run, state.spec)
        if report is not None and report.finished:
            finished = True
            state = desired_state(run, options.defaults, finished=True, gang_admitted=admitted)

    live: dict = {}
    failed: list[str] = []
    if state.error is None:
        live, failed = await _apply_state(runtime, run, body, state, finished, handler)
    else:
        logger.warning("invalid RLRun: %s", state.error)
        options.metrics.error(handler, "invalid_spec")

    pods = await asyncio.to_thread(_pods, runtime, run, logger)
    now = options.clock()
    observation = Observation(
        generation=int(meta.get("generation") or 0),
        now=now,
        error=state.error_message,
        suspended=bool(state.spec and state.spec.suspend),
        workloads=[workload_state(w, live.get(("apps/v1", w.kind, w.name))) for w in state.workloads],
        polled=polled,
        report=report,
        poll_error=poll_error,
        pods=pods,
        admission=admission,
        apply_errors=failed,
    )
    new = build_status(previous, observation)
    options.metrics.set_phase(meta["namespace"], meta["name"], new["phase"])
    for kind, reason, message in transition_events(previous, new):
        kopf.event(body, type=kind, reason=reason, message=message[:1000])
    for key, value in status_patch(previous, new).items():
        patch.status[key] = value

    if poll and state.spec is not None and ttl_expired(new, state.spec.ttl_seconds_after_finished, now):
        logger.info("ttlSecondsAfterFinished passed; deleting the run")
        await asyncio.to_thread(
            runtime.kube.delete, run["apiVersion"], run["kind"], meta["namespace"], meta["name"]
        )


async def _cleanup(runtime: _Runtime, body: Any, logger: logging.Logger) -> None:
    """A deleted run: its children, its Secret and its Kueue Workload go; it is forgotten."""
    options = runtime.options
    meta = body.get("metadata") or {}
    with options.metrics.timed("cleanup"):
        result = await asyncio.to_thread(
            prune_objects, runtime.kube, meta["name"], meta["namespace"], meta["uid"], []
        )
        # The Secret is never listed (the operator may not list Secrets): delete it by name.
        secret = auth_secret_name(Cluster(meta["name"], meta["namespace"]))
        if await asyncio.to_thread(runtime.kube.delete, "v1", "Secret", meta["namespace"], secret):
            result.deleted.append(f"Secret/{secret}")
        if (body.get("spec") or {}).get("queueName"):
            await asyncio.to_thread(_release_gang, runtime, _plain(body), result)
    runtime.forget(meta)
    options.metrics.forget(meta.get("namespace"), meta.get("name"))
    if result.deleted:
        logger.info("deleted %s", ", ".join(result.deleted))


def build_registry(options: OperatorOptions | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with the RLRun handlers bound to `options`."""
    options = options or OperatorOptions()
    runtime = _Runtime(options)
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    login = options.login

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's default login handlers: in a pod use the service
        # account, elsewhere the kubeconfig (KUBECONFIG or ~/.kube/config).
        if login is not None:
            return login()
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.resume(*resource, registry=registry, id="reconcile")
    @kopf.on.create(*resource, registry=registry, id="reconcile")
    @kopf.on.update(*resource, registry=registry, id="reconcile")
    async def reconcile(body: Any, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
        meta = body.get("metadata") or {}
        runtime.runs.add((meta.get("namespace"), meta.get("name")))
        async with runtime.pass_lock(meta):
            await sync(runtime, body, patch, logger, poll=False)

    # The first tick waits an interval: the create and resume handlers make the first pass.
    @kopf.timer(
        *resource,
        registry=registry,
        id="status",
        interval=options.status_interval_s,
        initial_delay=options.status_interval_s,
    )
    async def observe(body: Any, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
        meta = body.get("metadata") or {}
        lock = runtime.pass_lock(meta)
        if meta.get("deletionTimestamp") or lock.locked():
            return  # a pass under way (a change's) reads and writes what this one would
        async with lock:
            await sync(runtime, body, patch, logger, poll=True)

    @kopf.on.delete(*resource, registry=registry, id="cleanup")
    async def cleanup(body: Any, logger: logging.Logger, **_: Any) -> None:
        await _cleanup(runtime, body, logger)

    @kopf.on.probe(registry=registry, id="runs")
    def runs(**_: Any) -> int:
        return len(runtime.runs)

    return registry
