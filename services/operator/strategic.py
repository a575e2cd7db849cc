"""A strategic merge of a PodTemplateSpec patch (spec.<component>.podTemplate), as `kubectl
patch --type strategic` applies one to the fields of a pod template: maps merge key by key,
`null` removes a key, the lists Kubernetes declares with a merge key merge item by item, and
every other list is replaced. Only the pod-template lists are known here; that is all a
podTemplate can hold."""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "tolerations": None,  # replaced, as Kubernetes does (no merge key)
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
"""patchMergeKey of each pod-template list (from the Kubernetes API's struct tags)."""


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict) and isinstance(base, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    key = MERGE_KEYS.get(field)
    if isinstance(patch, list) and isinstance(base, list) and key is not None:
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise ValueError(f"podTemplate: each item of {field} needs {key!r}")
            at = next((i for i, have in enumerate(merged) if have.get(key) == item[key]), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = strategic_merge(merged[at], item, field)
        return merged
    return copy.deepcopy(patch)
