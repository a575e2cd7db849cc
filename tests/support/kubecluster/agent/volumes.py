"""A pod's volumes on the node, as kubelet prepares them: emptyDir, configMap, secret,
downwardAPI and projected (the ServiceAccount admission's kube-api-access-* included: a token
from the TokenRequest API, ca.crt from kube-root-ca.crt, the namespace) in the pod's folder;
persistentVolumeClaim through its bound PersistentVolume (the test cluster's provisioner makes
hostPath ones); hostPath.

ConfigMap, Secret, downward-API and projected volumes are written with kubelet's atomic writer
(the files are links into `..data`, a link to a timestamped folder that one rename swaps), and
`refresh()` rewrites them when their sources change, so that a running container sees an
edited ConfigMap as on a real node. The containers mount them read-only, as kubelet does."""

from __future__ import annotations

import base64
import datetime as dt
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .env import ConfigError, field_value, resource_value

TOKEN_REFRESH = 0.8
"""A projected token is requested again after this fraction of its lifetime, as kubelet does."""
WRITER_SOURCES = ("configMap", "secret", "downwardAPI", "projected")


class VolumeError(RuntimeError):
    """A volume that cannot be set up yet (a missing ConfigMap, an unbound claim): the pod stays
    in ContainerCreating with this message and the agent tries again."""


Payload = dict[str, tuple[bytes, int]]
"""Relative path -> (content, mode)."""


def write_atomic(folder: Path, payload: Payload, fs_group: int | None) -> bool:
    """kubelet's AtomicWriter: returns whether anything changed."""
    folder.mkdir(parents=True, exist_ok=True)
    data_link = folder / "..data"
    if data_link.is_symlink() and _same(folder / os.readlink(data_link), payload):
        return False
    stamp = folder / dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    stamp.mkdir()
    stamp.chmod(0o755)
    for relative, (content, mode) in payload.items():
        path = stamp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if fs_group is not None:
            # kubelet's SetVolumeOwnership: the pod's fsGroup owns the files and may read them.
            os.chown(path, -1, fs_group)
            mode |= 0o040
        path.chmod(mode)
    old = os.readlink(data_link) if data_link.is_symlink() else None
    tmp = folder / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(stamp.name)
    tmp.rename(data_link)
    tops = {Path(relative).parts[0] for relative in payload}
    for top in tops:
        link = folder / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in folder.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in tops:
            entry.unlink()
    if old is not None:
        shutil.rmtree(folder / old, ignore_errors=True)
    return True


def _same(current: Path, payload: Payload) -> bool:
    files = {str(p.relative_to(current)) for p in current.rglob("*") if p.is_file()}
    if files != set(payload):
        return False
    return all(
        (current / relative).read_bytes() == content
        and (current / relative).stat().st_mode & 0o777 & ~0o040 == mode & 0o777 & ~0o040
        for relative, (content, mode) in payload.items()
    )


def _items(
    data: dict[str, bytes], items: list[dict[str, Any]] | None, default_mode: int, what: str
) -> Payload:
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    payload = {}
    for item in items:
        if item["key"] not in data:
            raise VolumeError(f"{what} references non-existent key: {item['key']}")
        payload[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
    return payload


class PodVolumes:
    def __init__(
        self,
        pod: dict[str, Any],
        folder: Path,
        get: Callable[[str], dict[str, Any] | None],
        request_token: Callable[[str, dict[str, Any]], dict[str, Any]],
        allocatable: dict[str, str],
    ):
        """`get(path)` reads an API object (None when absent); `request_token(service_account,
        spec)` is the TokenRequest API."""
        self.pod = pod
        self.folder = folder
        self.get = get
        self.request_token = request_token
        self.allocatable = allocatable
        self.paths: dict[str, Path] = {}
        self.read_only: dict[str, bool] = {}
        self._tokens: dict[str, tuple[bytes, float, float]] = {}
        self.fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    def setup(self) -> None:
        """Prepares every volume not prepared yet; raises VolumeError for one that cannot be."""
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] not in self.paths:
                self.paths[volume["name"]] = self._prepare(volume)

    def refresh(self) -> None:
        for volume in self.pod["spec"].get("volumes") or []:
            if volume["name"] in self.paths and any(source in volume for source in WRITER_SOURCES):
                write_atomic(self.paths[volume["name"]], self._payload(volume), self.fs_group)

    def _prepare(self, volume: dict[str, Any]) -> Path:
        name = volume["name"]
        folder = self.folder / name
        if "emptyDir" in volume:
            # Medium Memory is a plain folder too: a tmpfs would be one more mount to leak.
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o777)
            return folder
        if any(source in volume for source in WRITER_SOURCES):
            write_atomic(folder, self._payload(volume), self.fs_group)
            self._nested_mount_points(name, folder)
            return folder
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]
            self.read_only[name] = bool(claim.get("readOnly"))
            return self._claim_path(claim["claimName"])
        if "hostPath" in volume:
            return host_path(volume["hostPath"])
        kind = next((key for key in volume if key != "name"), "?")
        raise VolumeError(f"volume {name}: {kind} volumes are not supported by the test node agent")

    def _nested_mount_points(self, name: str, folder: Path) -> None:
        """kubelet's MakeNestedMountpoints: these volumes are mounted read-only, so a runtime could
        not create the mount point of another volume mounted inside one (rlrun mounts its auth
        Secret at /etc/rlrun/auth, inside the config ConfigMap at /etc/rlrun); kubelet creates
        those folders in the volume when it sets it up."""
        spec = self.pod["spec"]
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            mounts = container.get("volumeMounts") or []
            for own in (m["mountPath"].rstrip("/") for m in mounts if m["name"] == name):
                for other in mounts:
                    path = other["mountPath"].rstrip("/")
                    if path.startswith(own + "/"):
                        (folder / path[len(own) + 1 :]).mkdir(parents=True, exist_ok=True)

    def _payload(self, volume: dict[str, Any]) -> Payload:
        if "projected" in volume:
            projected = volume["projected"]
            mode = projected.get("defaultMode", 0o644)
            payload: Payload = {}
            for source in projected.get("sources") or []:
                payload.update(self._source(source, mode))
            return payload
        kind = next(key for key in WRITER_SOURCES if key in volume)
        return self._source({kind: volume[kind]}, volume[kind].get("defaultMode", 0o644))

    def _source(self, source: dict[str, Any], mode: int) -> Payload:
        if "configMap" in source or "secret" in source:
            return self._object_source(source, mode)
        if "downwardAPI" in source:
            payload = {}
            for item in source["downwardAPI"].get("items") or []:
                payload[item["path"]] = (self._downward(item).encode(), item.get("mode", mode))
            return payload
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            return {token["path"]: (self._token(token), mode)}
        raise VolumeError(f"projected source {sorted(source)} is not supported by the test node agent")

    def _object_source(self, source: dict[str, Any], mode: int) -> Payload:
        kind = "configMap" if "configMap" in source else "secret"
        ref = source[kind]
        name = ref.get("name") or ref.get("secretName")
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        if obj is None:
            if ref.get("optional"):
                return {}
            raise VolumeError(f'{kind.lower()} "{name}" not found')
        if kind == "secret":
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data |= {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        return _items(data, ref.get("items"), ref.get("defaultMode", mode), f"{kind} {name}")

    def _downward(self, item: dict[str, Any]) -> str:
        try:
            if "fieldRef" in item:
                return field_value(self.pod, item["fieldRef"]["fieldPath"], for_volume=True)
            ref = item["resourceFieldRef"]
            container = next(c for c in self.pod["spec"]["containers"] if c["name"] == ref["containerName"])
            return resource_value(container, ref, self.allocatable)
        except ConfigError as error:
            raise VolumeError(str(error)) from error

    def _token(self, source: dict[str, Any]) -> bytes:
        key = f"{source.get('audience', '')}/{source.get('expirationSeconds', 3600)}"
        cached = self._tokens.get(key)
        now = time.time()
        if cached is not None and now < cached[1] + (cached[2] - cached[1]) * TOKEN_REFRESH:
            return cached[0]
        meta = self.pod["metadata"]
        spec: dict[str, Any] = {
            "expirationSeconds": source.get("expirationSeconds", 3600),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        status = self.request_token(account, spec)["status"]
        expires = dt.datetime.fromisoformat(status["expirationTimestamp"].replace("Z", "+00:00")).timestamp()
        token = status["token"].encode()
        self._tokens[key] = (token, now, expires)
        return token

    def _claim_path(self, claim_name: str) -> Path:
        claim = self.get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim_name}")
        if claim is None:
            raise VolumeError(f'persistentvolumeclaim "{claim_name}" not found')
        volume_name = claim["spec"].get("volumeName")
        if (claim.get("status") or {}).get("phase") != "Bound" or not volume_name:
            raise VolumeError(f'persistentvolumeclaim "{claim_name}" is not bound')
        volume = self.get(f"/api/v1/persistentvolumes/{volume_name}")
        if volume is None:
            raise VolumeError(f'persistentvolume "{volume_name}" not found')
        spec = volume["spec"]
        if "hostPath" in spec:
            return host_path(spec["hostPath"])
        if "local" in spec:
            return Path(spec["local"]["path"])
        raise VolumeError(
            f"persistentvolume {volume_name}: only hostPath and local volumes can be mounted here"
        )


def host_path(source: dict[str, Any]) -> Path:
    path = Path(source["path"])
    kind = source.get("type") or ""
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate" and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    checks = {"Directory": path.is_dir, "File": path.is_file, "Socket": path.is_socket}
    if kind in checks and not checks[kind]():
        raise VolumeError(f"hostPath {path} is not a {kind.lower()}")
    if not path.exists():
        raise VolumeError(f"hostPath {path} does not exist")
    return path
