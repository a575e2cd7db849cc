"""A small, blocking Kubernetes REST layer over the `kubernetes` client's ApiClient, and the
apply/prune steps of a reconcile.

Objects are plain dicts. Paths are built from (apiVersion, kind) for the few kinds the operator
touches, so no discovery round trips are needed. Objects are written by server-side apply, one
field manager per component (`rlrun-operator/<component>`), with force: the live object then
holds exactly the desired fields, and a field the RLRun no longer asks for (a nodeSelector, a
priorityClassName, the Kueue queue label) leaves it, which a merge patch never does. Two
passes that race (kopf's status timer beside an update handler) both succeed, where a create
would answer 409 to the second. A pass reads the run's objects with one list per kind (by the
run's label), for both the apply and the prune, not with a GET per object: the requests of a
pass do not grow with the objects of a run. An object is applied when it is missing, when the hash of its
desired form (kept in the annotation `rlrun.dev/applied-hash`) changed, or when someone edited a
field the operator sets (the desired object is no longer a subset of the live one; the fields
the API server defaults are extra and do not count, and resource quantities compare by value,
so "1" and 1 or "500m" and "0.5" are equal). The run's Secret is the exception: the operator
may not read Secrets, so it is applied on every pass without a read (an apply that changes
nothing writes nothing) and never listed (`WRITE_ONLY_KINDS`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from rlrun.operator.reconcile import OWNED_KINDS, RUN_LABEL, WRITE_ONLY_KINDS, content_hash, object_key

log = logging.getLogger("rlrun.operator.kube")

APPLIED_HASH = "rlrun.dev/applied-hash"
FIELD_MANAGER = "rlrun-operator"
PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Secret"): "secrets",
    ("v1", "Event"): "events",
    ("v1", "Pod"): "pods",
    ("apps/v1", "Deployment"): "deployments",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("rlrun.dev/v1alpha1", "RLRun"): "rlruns",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
}


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, body: str = ""):
        try:
            message = json.loads(body).get("message") or reason
        except (ValueError, AttributeError):
            message = reason
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def resource_path(
    api_version: str, kind: str, namespace: str, name: str | None = None, subresource: str = ""
) -> str:
    plural = PLURALS[(api_version, kind)]
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


class Kube:
    """Blocking calls (run them in a thread from async code)."""

    def __init__(self, api_client: Any, timeout_s: float = 30.0):
        self.api = api_client
        self.timeout_s = timeout_s

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        method_, url, headers, body, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method_, url, header_params=headers, body=body, post_params=post, _request_timeout=self.timeout_s
        )
        data = response.read()
        if not 200 <= response.status < 300:
            raise KubeError(
                response.status, response.reason or "", data.decode(errors="replace") if data else ""
            )
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        label_selector: dict[str, str],
        fields: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        query = {}
        if label_selector:
            query["labelSelector"] = ",".join(f"{k}={v}" for k, v in label_selector.items())
        if fields:
            query["fieldSelector"] = ",".join(f"{k}={v}" for k, v in fields.items())
        result = self._call("GET", resource_path(api_version, kind, namespace), query=query)
        return (result or {}).get("items") or []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self._call("POST", resource_path(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj)

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        path = resource_path(api_version, kind, namespace, name, subresource)
        return self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def apply(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply of `obj` as `manager` (force: the operator's word wins)."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        # JSON is YAML, so the apply body goes as JSON.
        return self._call(
            "PATCH",
            path,
            body=obj,
            query={"fieldManager": manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        try:
            self._call(
                "DELETE",
                resource_path(api_version, kind, namespace, name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
            )
            return True
        except KubeError as error:
            if error.status == 404:
                return False
            raise


@dataclass
class ApplyResult:
    live: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


def _quantity(value: Any) -> Any:
    try:
        from kubernetes.utils import parse_quantity

        return parse_quantity(value)
    except (ValueError, TypeError, ImportError):
        return value


def is_subset(desired: Any, live: Any, quantities: bool = False) -> bool:
    """Whether every field of `desired` has the same value in `live` (lists item by item)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        return all(
            key in live
            and is_subset(value, live[key], quantities or key in ("requests", "limits", "capacity"))
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v, quantities) for d, v in zip(desired, live, strict=True))
        )
    if quantities and desired != live:
        return _quantity(desired) == _quantity(live)
    return desired == live


def _label(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def field_manager(obj: dict[str, Any]) -> str:
    """The field manager of an object: one per component, so that the fields of each are
    told apart in `managedFields`."""
    component = ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")
    return f"{FIELD_MANAGER}/{component}" if component else FIELD_MANAGER


@dataclass
class Owned:
    """The objects labelled as one run's, read with one list per kind."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    listed: set[tuple[str, str]] = field(default_factory=set)
    """The kinds read; a kind whose list failed is not among them."""
    failed: list[str] = field(default_factory=list)


def list_owned(kube: Kube, run_name: str, namespace: str, kinds=OWNED_KINDS) -> Owned:
    owned = Owned()
    for api_version, kind in kinds:
        try:
            items = kube.list(api_version, kind, namespace, {RUN_LABEL: run_name})
        except KubeError as error:
            owned.failed.append(f"list {kind}: {error.message}")
            continue
        owned.listed.add((api_version, kind))
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            owned.objects[object_key(item)] = item
    return owned


def apply_objects(
    kube: Kube, desired: list[dict[str, Any]], owned: Owned, result: ApplyResult | None = None
) -> ApplyResult:
    """Server-side apply what is missing or changed. The live objects come from `owned` (the
    run's objects as listed: one request per kind, never a GET per object, so the chart grants
    no `get` on them). An object the API server refuses (e.g. an immutable field), or one of a
    kind whose list failed, is reported in `failed` and left as it is."""
    result = result or ApplyResult()
    for obj in desired:
        digest = content_hash(obj)
        obj = json.loads(json.dumps(obj))
        obj["metadata"].setdefault("annotations", {})[APPLIED_HASH] = digest
        api_version, kind, name = object_key(obj)
        try:
            if (api_version, kind) in WRITE_ONLY_KINDS:
                # The answer is not kept (nor compared): the desired form is all the operator
                # knows of it.
                kube.apply(obj, field_manager(obj))
                continue
            if (api_version, kind) not in owned.listed:
                # Unknown, not missing: the next pass, whose list may answer, applies it.
                result.failed.append(f"{_label(obj)}: its kind was not listed")
                continue
            live = owned.objects.get(object_key(obj))
            if live is None:
                live = kube.apply(obj, field_manager(obj))
                result.created.append(_label(obj))
            elif ((live.get("metadata") or {}).get("annotations") or {}).get(
                APPLIED_HASH
            ) != digest or not is_subset(obj, live):
                live = kube.apply(obj, field_manager(obj))
                result.updated.append(_label(obj))
        except KubeError as error:
            log.warning("cannot apply %s: %s", _label(obj), error)
            result.failed.append(f"{_label(obj)}: {error.message}")
            continue
        result.live[object_key(obj)] = live
    return result


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def prune_objects(
    kube: Kube,
    run_name: str,
    namespace: str,
    uid: str,
    keep: list[dict[str, Any]],
    kinds=OWNED_KINDS,
    result: ApplyResult | None = None,
    owned: Owned | None = None,
) -> ApplyResult:
    """Delete objects this run owns (by label and owner uid) that are not in `keep`, from
    `owned` when the run's objects were listed already."""
    result = result or ApplyResult()
    owned = owned or list_owned(kube, run_name, namespace, kinds)
    result.failed.extend(owned.failed)
    wanted = {object_key(obj) for obj in keep}
    for (api_version, kind, name), item in owned.objects.items():
        if not owned_by(item, uid) or (api_version, kind, name) in wanted:
            continue
        try:
            if kube.delete(api_version, kind, namespace, name):
                result.deleted.append(_label(item))
        except KubeError as error:
            result.failed.append(f"delete {_label(item)}: {error.message}")
    return result
