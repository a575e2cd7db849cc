"""What kubelet computes from a pod spec before a container starts: the downward API's field and
resource values, the environment (envFrom, env with valueFrom) and `$(VAR)` expansion in env
values, command and args."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class ConfigError(ValueError):
    """A reference that cannot be resolved yet (a missing Secret, key or field): kubelet's
    CreateContainerConfigError; the container waits and the agent tries again."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """kubelet's expansion (k8s.io/kubernetes third_party/forked/golang/expansion): `$(NAME)`
    becomes the variable's value when it is defined and stays as written when not; `$$` is a
    literal `$`."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            following = text[cursor + 1]
            advance = 1
            if following == "$":
                out.append("$")
            elif following == "(":
                close = text.find(")", cursor + 2)
                if close == -1:
                    out.append("$(")
                else:
                    name = text[cursor + 2 : close]
                    out.append(env.get(name, f"$({name})"))
                    advance = close - cursor
            else:
                out.append("$" + following)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def field_value(pod: dict[str, Any], path: str, for_volume: bool = False) -> str:
    """A downward-API fieldRef's value (a volume may also use all labels or annotations)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    subscript = _SUBSCRIPT.match(path)
    if subscript:
        return (meta.get(subscript[1]) or {}).get(subscript[2], "")
    if for_volume and path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "".join(f"{key}={json.dumps(values[key])}\n" for key in sorted(values))
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldPath {path!r}")
    return simple[path]


def resource_value(container: dict[str, Any], ref: dict[str, Any], allocatable: Mapping[str, str]) -> str:
    """A resourceFieldRef's value: the container's limit (the node's allocatable when it sets
    none) or request, divided by the divisor and rounded up, as kubelet does."""
    kind, _, resource = ref["resource"].partition(".")
    values = (container.get("resources") or {}).get(kind) or {}
    if resource in values:
        quantity = parse_quantity(values[resource])
    elif kind == "limits":
        quantity = parse_quantity(allocatable.get(resource, "0"))
    else:
        quantity = Decimal(0)
    divisor = parse_quantity(ref.get("divisor") or "1")
    if divisor == 0:
        raise ConfigError(f"resourceFieldRef {ref['resource']}: divisor is 0")
    return str(math.ceil(quantity / divisor))


Lookup = Callable[[str, str], dict[str, Any] | None]
"""(kind "configmaps" or "secrets", name) -> the object, None when it does not exist."""


def _source_data(lookup: Lookup, kind: str, name: str, optional: bool) -> dict[str, str] | None:
    obj = lookup(kind, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind[:-1]} "{name}" not found')
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def container_env(
    pod: dict[str, Any],
    container: dict[str, Any],
    base: Mapping[str, str],
    lookup: Lookup,
    allocatable: Mapping[str, str],
) -> dict[str, str]:
    """The container's variables on top of `base` (the service variables kubelet always sets):
    envFrom first, then env in order, each value expanded against what precedes it."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        kind, ref = _reference(source, "configMapRef", "secretRef")
        data = _source_data(lookup, kind, ref["name"], bool(ref.get("optional")))
        prefix = source.get("prefix", "")
        for key, value in (data or {}).items():
            if _ENV_NAME.match(prefix + key):  # kubelet skips keys that are no variable name
                env[prefix + key] = value
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            env[var["name"]] = expand(var.get("value", ""), env)
            continue
        value = _value_from(pod, container, var["valueFrom"], lookup, allocatable)
        if value is not None:
            env[var["name"]] = value
    return env


def _value_from(
    pod: dict[str, Any],
    container: dict[str, Any],
    source: dict[str, Any],
    lookup: Lookup,
    allocatable: Mapping[str, str],
) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        ref = source["resourceFieldRef"]
        named = ref.get("containerName") or container["name"]
        target = next(c for c in _all_containers(pod) if c["name"] == named)
        return resource_value(target, ref, allocatable)
    kind, ref = _reference(source, "configMapKeyRef", "secretKeyRef")
    optional = bool(ref.get("optional"))
    data = _source_data(lookup, kind, ref["name"], optional)
    if data is None:
        return None
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind[:-1]} {ref['name']}")
    return data[ref["key"]]


def _reference(source: dict[str, Any], config_map: str, secret: str) -> tuple[str, dict[str, Any]]:
    """("configmaps" or "secrets", the reference) of an envFrom or valueFrom source."""
    return ("configmaps", source[config_map]) if config_map in source else ("secrets", source[secret])


def _all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
