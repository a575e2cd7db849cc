"""The apply/prune layer: what counts as drift, and create/patch/prune against the real API server."""

from __future__ import annotations

import asyncio
import copy

from rlrun.operator.kube import APPLIED_HASH, apply_objects, is_subset, list_owned, prune_objects

from .conftest import load_sample


def test_server_defaults_and_equal_quantities_are_not_drift():
    desired = {
        "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "0.5"}}}]}
    }
    live = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}},
                    "terminationMessagePath": "/dev/termination-log",
                }
            ],
            "dnsPolicy": "ClusterFirst",
        }
    }
    assert is_subset(desired, live)


def test_edits_to_operator_fields_are_drift():
    desired = {"spec": {"replicas": 1, "template": {"spec": {"containers": [{"image": "a:1"}]}}}}
    assert not is_subset(
        desired, {"spec": {"replicas": 3, "template": {"spec": {"containers": [{"image": "a:1"}]}}}}
    )
    assert not is_subset(
        desired, {"spec": {"replicas": 1, "template": {"spec": {"containers": [{"image": "a:2"}]}}}}
    )
    assert not is_subset(desired, {"spec": {"replicas": 1, "template": {"spec": {"containers": []}}}})
    assert not is_subset(
        {"spec": {"replicas": "1"}}, {"spec": {"replicas": 1}}
    )  # quantities only under resources


def apply(kube, objects: list[dict]):
    """As a pass applies: from the run's objects, listed."""
    return apply_objects(kube, objects, list_owned(kube, "r", objects[0]["metadata"]["namespace"]))


def config_map(data: str, namespace: str, uid: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "r-config",
            "namespace": namespace,
            "labels": {"rlrun.dev/run": "r"},
            "ownerReferences": [
                {"apiVersion": "rlrun.dev/v1alpha1", "kind": "RLRun", "name": "r", "uid": uid}
            ],
        },
        "data": {"config.toml": data},
    }


async def test_apply_creates_patches_only_on_change_and_prunes(kube, namespace):
    # A real owner: the garbage collector deletes a dependent whose owner does not exist.
    owner = load_sample(namespace=namespace)
    owner["metadata"]["name"] = "r"
    uid = (await asyncio.to_thread(kube.create, owner))["metadata"]["uid"]
    first = await asyncio.to_thread(apply, kube, [config_map("a = 1", namespace, uid)])
    assert first.created == ["ConfigMap/r-config"] and not first.updated
    live = first.live[("v1", "ConfigMap", "r-config")]
    assert live["metadata"]["annotations"][APPLIED_HASH]
    # The API server's own record: one field manager per component (here none: the operator's).
    assert [m["manager"] for m in live["metadata"]["managedFields"]] == ["rlrun-operator"]
    again = await asyncio.to_thread(apply, kube, [config_map("a = 1", namespace, uid)])
    assert not again.changed
    changed = await asyncio.to_thread(apply, kube, [config_map("a = 2", namespace, uid)])
    assert changed.updated == ["ConfigMap/r-config"]
    assert (await asyncio.to_thread(kube.get, "v1", "ConfigMap", namespace, "r-config"))["data"] == {
        "config.toml": "a = 2"
    }
    # Someone else's object with the run's label but no owner reference is never pruned.
    foreign = copy.deepcopy(config_map("x", namespace, uid))
    foreign["metadata"]["name"] = "not-ours"
    foreign["metadata"]["ownerReferences"] = []
    await asyncio.to_thread(kube.create, foreign)
    pruned = await asyncio.to_thread(prune_objects, kube, "r", namespace, uid, [])
    assert pruned.deleted == ["ConfigMap/r-config"]
    assert await asyncio.to_thread(kube.get, "v1", "ConfigMap", namespace, "not-ours")
    assert await asyncio.to_thread(kube.get, "v1", "ConfigMap", namespace, "r-config") is None
