"""What the operator tests read of a run through the real API server (blocking calls: run them
in a thread, e.g. through `eventually`)."""

from __future__ import annotations

import asyncio
import copy

from .conftest import load_sample

SAMPLE = load_sample()
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


def sample(namespace: str, **spec) -> dict:
    run = copy.deepcopy(SAMPLE)
    run["metadata"]["namespace"] = namespace
    run["spec"].update(spec)
    return run


def present(kube, namespace: str) -> set[tuple[str, str, str]]:
    """The run's children, through the API (blocking; run it in a thread)."""
    found = set()
    for api_version, kind in KINDS:
        found |= {
            (api_version, kind, o["metadata"]["name"])
            for o in kube.list(api_version, kind, namespace, {"rlrun.dev/run": NAME})
        }
    return found


def has(kube, namespace, expected):
    return lambda: present(kube, namespace) == expected


def get_run(kube, namespace, name: str = NAME):
    return kube.get(*RLRUN, namespace, name)


def phase_is(kube, namespace, phase, name: str = NAME):
    def check():
        run = get_run(kube, namespace, name)
        return (run or {}).get("status", {}).get("phase") == phase and run

    return check


def conditions(run):
    return {c["type"]: c["status"] for c in run["status"]["conditions"]}


def events(kube, namespace) -> list[dict]:
    return kube.list("v1", "Event", namespace, {}, fields={"involvedObject.kind": "RLRun"})


def pods(kube, namespace, name: str = NAME) -> list[dict]:
    return kube.list("v1", "Pod", namespace, {"rlrun.dev/run": name})


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def describe(pod: dict) -> str:
    status = pod.get("status") or {}
    why = [
        f"{c['type']}={c['status']}:{c.get('reason', '')}:{c.get('message', '')}"
        for c in status.get("conditions") or []
    ]
    gone = " (terminating)" if pod["metadata"].get("deletionTimestamp") else ""
    return f"{pod['metadata']['name']}{gone} {status.get('phase')} on {pod['spec'].get('nodeName')} {why}"


def no_pods(kube, namespace, name: str = NAME):
    def check():
        found = pods(kube, namespace, name)
        if found:
            raise AssertionError(
                "; ".join(f"{describe(p)} finalizers={p['metadata'].get('finalizers')}" for p in found)
            )
        return True

    return check


def all_pods_ready(kube, namespace, count, name: str = NAME):
    """A check that every one of `count` pods is Ready; until then it says what the pods are."""

    def check():
        found = pods(kube, namespace, name)
        ready = [p for p in found if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
        if len(found) == count and len(ready) == count:
            return found
        raise AssertionError(f"{len(ready)}/{count} ready: " + "; ".join(describe(p) for p in found))

    return check


def operator_calls(cluster, user: str, resource: str) -> list[tuple[str, str]]:
    """(verb, name) of every request the operator's ServiceAccount made on `resource`."""
    return [
        (e["verb"], (e.get("objectRef") or {}).get("name", ""))
        for e in cluster.audit_events()
        if e["user"]["username"] == user and (e.get("objectRef") or {}).get("resource") == resource
    ]
