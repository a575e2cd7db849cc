"""A dynamic volume provisioner for the test cluster, as rancher's local-path-provisioner is for
kind: a claim of a StorageClass whose provisioner is PROVISIONER (the default class `standard`,
or one a test creates, such as a sample's `shared-nfs`) gets a hostPath PersistentVolume under
the cluster's folder, and a released volume is deleted with its folder.

It only creates and deletes PersistentVolumes, like any external provisioner; binding a claim
to its volume, `Bound`/`Released` and the `pvc-protection` finalizers are the real
controller-manager's work."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("kubecluster.provisioner")

PROVISIONER = "rlrun.dev/test-local-path"
STORAGE_CLASS = "standard"


def storage_class(name: str = STORAGE_CLASS, default: bool = True) -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


class Provisioner:
    def __init__(self, api_client: Any, root: Path, interval_s: float = 0.5):
        import kubernetes

        self.core = kubernetes.client.CoreV1Api(api_client)
        self.storage = kubernetes.client.StorageV1Api(api_client)
        self.root = root
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="provisioner", daemon=True)

    def start(self) -> Provisioner:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def volume_path(self, pv_name: str) -> Path:
        return self.root / pv_name

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - the API may be restarting; try again
                log.warning("provisioner pass failed: %s", error)

    def sync(self) -> None:
        import kubernetes

        volumes = {pv.metadata.name: pv for pv in self.core.list_persistent_volume().items}
        classes = {c.metadata.name: c.provisioner for c in self.storage.list_storage_class().items}
        for claim in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if claim.status.phase != "Pending" or claim.metadata.deletion_timestamp:
                continue
            if classes.get(claim.spec.storage_class_name or "") != PROVISIONER:
                continue
            name = f"pvc-{claim.metadata.uid}"
            if name in volumes:
                continue
            path = self.volume_path(name)
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
            body = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": claim.spec.resources.requests["storage"]},
                    "accessModes": list(claim.spec.access_modes),
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": claim.spec.storage_class_name,
                    "volumeMode": claim.spec.volume_mode or "Filesystem",
                    "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": claim.metadata.namespace,
                        "name": claim.metadata.name,
                        "uid": claim.metadata.uid,
                    },
                },
            }
            try:
                self.core.create_persistent_volume(body)
            except kubernetes.client.ApiException as error:
                if error.status != 409:
                    raise
        for name, pv in volumes.items():
            annotations = pv.metadata.annotations or {}
            if annotations.get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
                continue
            if pv.status.phase == "Released" and pv.spec.persistent_volume_reclaim_policy == "Delete":
                shutil.rmtree(self.volume_path(name), ignore_errors=True)
                try:
                    self.core.delete_persistent_volume(name)
                except kubernetes.client.ApiException as error:
                    if error.status != 404:
                        raise
