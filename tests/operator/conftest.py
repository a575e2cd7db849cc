"""A Kubernetes API for operator tests: KMock's emulator plus the API-server behaviours it lacks.

KMock (`kmock.KubernetesEmulator`) stores objects in memory, merges patches into them and
streams watch events, but it is not an API server. This fixture fills in, on every write:

- `metadata.uid` (a UUID) and `metadata.creationTimestamp` on create, and `metadata.name` from
  `metadata.generateName` (kopf posts its Events that way; KMock would key them all as None);
- `metadata.namespace` from the URL when the body has none (kubectl, kopf and our client rely
  on it being present in the stored object);
- `metadata.resourceVersion`, a counter bumped on every create and patch. kopf guards its
  JSON patches with a `test` op on it, so without this kopf cannot add its finalizer;
- `metadata.generation`: 1 on create, +1 when a patch changes `spec` (for observedGeneration);
- 422 Unprocessable Entity (not 500) when a JSON patch's `test` op fails: kopf relies on that
  answer to re-read the object and retry its finalizer patch on the next cycle;
- the status subresource: a patch of `/status` changes only `status`, and a patch or create of
  the main resource ignores `status`, for the resources declared with a status subresource;
- validation of RLRun objects against the CRD's OpenAPI schema (422 Invalid), as the API server
  does with a structural schema (CEL rules are not evaluated);
- server-side apply (`PATCH` as `application/apply-patch+yaml` with a `fieldManager`): the
  object is created when missing; each field manager owns the fields it applied last, and a
  field it owned before and leaves out now is removed unless another manager owns it too.
  Simplified: every list is owned as a whole (the API server merges keyed lists such as
  `containers` item by item, which only matters with several managers on one list);
- `apiVersion` and `kind` (`<Kind>List`) on list responses (kubectl refuses a list without them);
- discovery: subresources (`rlruns/status`) listed without the short names of their resource
  (KMock copies them, which makes `kubectl get rlr` ambiguous).

Still not emulated, and not needed here: garbage collection through ownerReferences (the
operator's delete handler removes the children itself, which the test checks), label selectors
and field selectors on lists (the operator filters on its side too), strategic merge patch (treated as a merge
patch), Table output for `kubectl get`, and watch resourceVersion resumption.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import inspect
import itertools
import shutil
import uuid
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import jsonpointer
import jsonschema
import kmock
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "operator" / "crd.yaml"

_RESOURCES: dict[tuple[str, str, str], dict[str, Any]] = {
    ("rlrun.dev", "v1alpha1", "rlruns"): dict(
        kind="RLRun",
        singular="rlrun",
        namespaced=True,
        shortnames={"rlr"},
        subresources={"status"},
    ),
    ("", "v1", "configmaps"): dict(
        kind="ConfigMap", singular="configmap", namespaced=True, shortnames={"cm"}
    ),
    ("", "v1", "services"): dict(
        kind="Service", singular="service", namespaced=True, shortnames={"svc"}, subresources={"status"}
    ),
    ("", "v1", "persistentvolumeclaims"): dict(
        kind="PersistentVolumeClaim",
        singular="persistentvolumeclaim",
        namespaced=True,
        shortnames={"pvc"},
        subresources={"status"},
    ),
    ("", "v1", "secrets"): dict(kind="Secret", singular="secret", namespaced=True),
    ("", "v1", "pods"): dict(
        kind="Pod", singular="pod", namespaced=True, shortnames={"po"}, subresources={"status"}
    ),
    ("policy", "v1", "poddisruptionbudgets"): dict(
        kind="PodDisruptionBudget",
        singular="poddisruptionbudget",
        namespaced=True,
        shortnames={"pdb"},
        subresources={"status"},
    ),
    ("networking.k8s.io", "v1", "networkpolicies"): dict(
        kind="NetworkPolicy", singular="networkpolicy", namespaced=True, shortnames={"netpol"}
    ),
    ("", "v1", "events"): dict(kind="Event", singular="event", namespaced=True, shortnames={"ev"}),
    ("", "v1", "namespaces"): dict(
        kind="Namespace", singular="namespace", namespaced=False, shortnames={"ns"}
    ),
    ("apps", "v1", "deployments"): dict(
        kind="Deployment",
        singular="deployment",
        namespaced=True,
        shortnames={"deploy"},
        subresources={"status"},
    ),
    ("apps", "v1", "statefulsets"): dict(
        kind="StatefulSet",
        singular="statefulset",
        namespaced=True,
        shortnames={"sts"},
        subresources={"status"},
    ),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): dict(
        kind="CustomResourceDefinition",
        singular="customresourcedefinition",
        namespaced=False,
        shortnames={"crd"},
    ),
}
_VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _fields(obj: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The field paths of `obj` as server-side apply owns them: every map key on the way to a
    value (a list is one field)."""
    paths = {prefix} if prefix else set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            paths |= _fields(value, (*prefix, key))
    return paths


def _without(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    """Removes the field at `path`, unless it is a map that still holds fields."""
    node = obj
    for key in path[:-1]:
        node = node.get(key)
        if not isinstance(node, dict):
            return
    if not (isinstance(node.get(path[-1]), dict) and node[path[-1]]):
        node.pop(path[-1], None)


def _merge_patch_between(before: Any, after: Any) -> Any:
    """A merge patch that turns `before` into `after` (None removes a key)."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return copy.deepcopy(after)
    patch = {key: None for key in before if key not in after}
    for key, value in after.items():
        if key not in before or before[key] != value:
            patch[key] = _merge_patch_between(before.get(key), value)
    return patch


def _rewrite(request: Any, **changes: Any) -> Any:
    """`request` changed in place: KMock finds its reactions by the identity of the request it
    logged, so a copy (attrs.evolve) would match none."""
    for name, value in changes.items():
        object.__setattr__(request, name, value)
    return request


def _crd_validator() -> jsonschema.Validator:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """KMock's emulator with the API-server behaviours listed in this module's docstring."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _rlrun_schema: Any = attrs.field(factory=_crd_validator, init=False)
    managed: dict[Any, dict[str, set[tuple[str, ...]]]] = attrs.field(factory=dict, init=False)
    """(resource, namespace, name) -> field manager -> the field paths it owns."""
    _applying: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    """One apply at a time: its create-or-patch decision must hold until it is served."""
    secret_reads: list[str] = attrs.field(factory=list, init=False)
    """Every get, list and watch of Secrets, as "ACTION name"."""

    def declare_resources(self) -> None:
        for (group, version, plural), info in _RESOURCES.items():
            self.resources[kmock.resource(group, version, plural)] = kmock.ResourceInfo(verbs=_VERBS, **info)

    def _has_status_subresource(self, resource: Any) -> bool:
        for known in self.resources:
            if known == resource:
                return "status" in self.resources[known].subresources
        return False

    def _stored(self, request: Any) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            return self.objects[key].raw
        return None

    def _validate_rlrun(self, body: dict[str, Any]) -> None:
        errors = sorted(self._rlrun_schema.iter_errors(body), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first.path) or "<root>"
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f'RLRun.rlrun.dev "{(body.get("metadata") or {}).get("name")}" is invalid: {where}: {first.message}',
                details={"causes": [{"field": where, "message": first.message}]},
            )

    def _fill_create(self, request: Any) -> None:
        data = request.data
        meta = data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self._has_status_subresource(request.resource):
            data.pop("status", None)
        if request.resource.plural == "rlruns":
            self._validate_rlrun(data)

    def _fill_patch(self, request: Any) -> None:
        data = request.data
        current = self._stored(request)
        if current is None:
            return  # KMock answers 404
        version = str(next(self._versions))
        status_only = request.subresource == "status"
        if isinstance(data, list):  # JSON patch
            touches_spec = any(str(op.get("path", "")).startswith("/spec") for op in data)
            data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            if touches_spec and not status_only:
                data.append(
                    {
                        "op": "add",
                        "path": "/metadata/generation",
                        "value": int(current["metadata"].get("generation", 1)) + 1,
                    }
                )
            return
        if not isinstance(data, dict):
            return
        if status_only:
            for key in [k for k in data if k != "status"]:
                del data[key]
        elif self._has_status_subresource(request.resource):
            data.pop("status", None)
        meta = data.setdefault("metadata", {})
        meta["resourceVersion"] = version
        if "spec" in data and not status_only:
            merged = _merge_patch(current.get("spec"), data["spec"])
            if merged != current.get("spec"):
                meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if request.resource.plural == "rlruns" and not status_only:
            self._validate_rlrun(_merge_patch(current, data))

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        resource = request.resource
        group_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        kind = next((self.resources[r].kind for r in self.resources if r == resource), None) or "Object"
        return {"apiVersion": group_version, "kind": f"{kind}List", **result}

    async def _serve_version(self, request: Any) -> Any:
        result = await super()._serve_version(request)
        for entry in result.get("resources", []):
            if "/" in entry["name"]:
                entry["shortNames"] = []
                entry["categories"] = []
        return result

    def _apply(self, request: Any) -> Any:
        """A server-side apply turned into the create or merge patch it amounts to."""
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="fieldManager is required for apply"
            )
        key = (request.resource, request.namespace, request.name)
        applied = copy.deepcopy(request.data)
        owners = self.managed.setdefault(key, {})
        current = self._stored(request)
        if current is None:
            owners.clear()
            owners[manager] = _fields(applied)
            return _rewrite(request, action=kmock.action.CREATE, method="POST", name=None, data=applied)
        owned_now = _fields(applied)
        others = set().union(*(paths for m, paths in owners.items() if m != manager))
        result = copy.deepcopy(current)
        # Deepest first, so that a map whose fields all go goes too.
        for path in sorted(owners.get(manager, set()) - owned_now - others, key=len, reverse=True):
            _without(result, path)
        result = _merge_patch(result, applied)
        owners[manager] = owned_now
        return _rewrite(request, data=_merge_patch_between(current, result))

    async def _handle(self, request: Any) -> Any:
        # Every read of a Secret, whoever made it: the operator must make none.
        reads = (kmock.action.FETCH, kmock.action.LIST, kmock.action.WATCH)
        if request.resource is not None and request.resource.plural == "secrets" and request.action in reads:
            self.secret_reads.append(f"{request.action.name} {request.name or ''}")
        content_type = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
        if request.action == kmock.action.UPDATE and content_type.startswith("application/apply-patch"):
            async with self._applying:
                return await self._serve(self._apply(request))
        return await self._serve(request)

    async def _serve(self, request: Any) -> Any:
        if request.resource is not None and isinstance(request.data, dict | list):
            if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                self._fill_create(request)
            elif request.action == kmock.action.UPDATE and request.name is not None:
                self._fill_patch(request)
        try:
            return await super()._handle(request)
        except (
            jsonpatch.JsonPatchConflict,
            jsonpatch.JsonPatchTestFailed,
            jsonpointer.JsonPointerException,
        ) as error:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message=f"the JSON patch does not apply: {error}"
            ) from None


@pytest.fixture
async def k8s():
    """A running emulated API server (`k8s.url`) with the resources the operator uses."""
    emulator = ApiServerEmulator()
    emulator.declare_resources()
    async with emulator, kmock.Server(emulator):
        yield emulator


@pytest.fixture
def api_client(k8s):
    import kubernetes

    configuration = kubernetes.client.Configuration()
    configuration.host = str(k8s.url).rstrip("/")
    client = kubernetes.client.ApiClient(configuration)
    yield client
    client.close()


@pytest.fixture
def kube(api_client):
    from rlrun.operator.kube import Kube

    return Kube(api_client, timeout_s=10)


@pytest.fixture
def kubectl(k8s, tmp_path):
    """Runs the kubectl binary against the emulator (the machine image ships kubectl; a test
    that needs it fails without it rather than skip and hide that)."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("no kubectl binary on PATH: install kubectl (the tests drive it against KMock)")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": str(k8s.url).rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "test"}}],
                "contexts": [
                    {
                        "name": "kmock",
                        "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"},
                    }
                ],
                "current-context": "kmock",
            }
        )
    )

    async def run(*args: str, check: bool = True) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--kubeconfig={kubeconfig}",
            f"--cache-dir={tmp_path / 'kube-cache'}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        result = process.returncode, out.decode(), err.decode()
        if check and process.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({process.returncode}): {result[2]}")
        return result

    return run


async def _eventually(check, timeout: float = 10.0, interval: float = 0.1, message: str = ""):
    """Polls `check()` until it returns a truthy value; returns that value. A plain function runs
    in a thread: the emulator serves from this event loop, so blocking clients must not run on it."""
    deadline = asyncio.get_running_loop().time() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = await check() if inspect.iscoroutinefunction(check) else await asyncio.to_thread(check)
            if value:
                return value
            last_error = None
        except (AssertionError, KeyError, TypeError, IndexError, OSError) as error:
            last_error = error
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s: {message}" + (f" (last: {last_error!r})" if last_error else "")
            )
        await asyncio.sleep(interval)


@pytest.fixture
def eventually():
    return _eventually


@pytest.fixture
async def orchestrator_stub():
    """A stand-in OrchestratorService on 127.0.0.1: GetStatus answers `stub.response`."""
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

    class Stub(orchestrator_pb2_grpc.OrchestratorServiceServicer):
        def __init__(self) -> None:
            self.response = orchestrator_pb2.GetRunStatusResponse(phase=orchestrator_pb2.RUN_PHASE_PENDING)
            self.calls = 0
            self.port = 0
            self.authorization: str | None = None
            """The `authorization` metadata of the last call."""

        async def GetStatus(self, request, context):  # noqa: N802 - gRPC method name
            self.calls += 1
            self.authorization = dict(context.invocation_metadata()).get("authorization")
            return self.response

    stub = Stub()
    server = grpc.aio.server()
    orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(stub, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    stub.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield stub
    await server.stop(grace=None)


@pytest.fixture
async def run_operator(k8s, api_client):
    """Starts the real kopf operator (our registry and settings) against the emulator.

    kopf runs in a thread with its own event loop: on exit it cancels every task created after
    its start in its loop, which would include the test's own fixture teardown."""
    import threading

    import kopf

    from rlrun.operator.handlers import OperatorOptions, build_registry, configure_settings

    running: list[tuple[threading.Event, threading.Thread]] = []
    url = str(k8s.url).rstrip("/")

    async def start(**overrides: Any) -> None:
        options = OperatorOptions(
            api_client_factory=lambda: api_client,
            login=lambda: kopf.ConnectionInfo(server=url, insecure=True),
            **overrides,
        )
        settings = configure_settings(kopf.OperatorSettings(), options)
        settings.watching.reconnect_backoff = 0.1
        settings.queueing.idle_timeout = 0.5
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(
            target=kopf.run,
            kwargs=dict(
                registry=build_registry(options),
                settings=settings,
                clusterwide=True,
                standalone=True,
                stop_flag=stop,
                ready_flag=ready,
            ),
            name="kopf",
            daemon=True,
        )
        thread.start()
        running.append((stop, thread))
        assert await asyncio.to_thread(ready.wait, 10), "kopf did not start"

    yield start
    for stop, _ in running:
        stop.set()
    for _, thread in running:
        await asyncio.to_thread(thread.join, 20)
        assert not thread.is_alive(), "kopf did not stop"
