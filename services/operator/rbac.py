"""The Kubernetes permissions the operator uses, and why. The Helm chart grants exactly these
(`charts/rlrun/templates/_helpers.tpl`: `rlrun.rules` and `rlrun.secretRules`); a chart test
compares them, and tests/operator/test_rbac.py checks them against the requests the operator
makes to a real API server (its audit log). No wildcards.

Secrets are granted apart: only in the namespaces where runs may run (`operator.runNamespaces`,
or the watched namespaces), never cluster-wide, so that the operator cannot touch the Secrets of
the rest of the cluster even when it watches every namespace."""

from __future__ import annotations

REQUIRED_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    # kopf lists and watches RLRuns and patches their annotations and finalizer; the TTL
    # deletes finished runs; the status is written through its subresource. Nothing reads a run
    # by name (no get: the audit log of a whole run's life has none).
    ("rlrun.dev", "rlruns", ("list", "watch", "patch", "delete")),
    ("rlrun.dev", "rlruns/status", ("patch",)),
    # ownerReferences with blockOwnerDeletion need update on the owner's finalizers.
    ("rlrun.dev", "rlruns/finalizers", ("update",)),
    # The run's children: one list per kind and pass (the live objects for the apply and the
    # prune; no get), server-side apply (patch; create too when the apply creates the object)
    # and prune (delete).
    ("", "configmaps", ("list", "create", "patch", "delete")),
    ("", "services", ("list", "create", "patch", "delete")),
    ("", "persistentvolumeclaims", ("list", "create", "patch", "delete")),
    ("apps", "statefulsets", ("list", "create", "patch", "delete")),
    ("apps", "deployments", ("list", "create", "patch", "delete")),
    ("policy", "poddisruptionbudgets", ("list", "create", "patch", "delete")),
    ("networking.k8s.io", "networkpolicies", ("list", "create", "patch", "delete")),
    # Read only: the status counts the restarts of the run's pods and says why one does not
    # run (one list per sync).
    ("", "pods", ("list",)),
    # Kubernetes Events on phase and condition transitions (create); a Pending pod's Events
    # say why it does not start (list, read only).
    ("", "events", ("create", "list")),
    # A queued run's Kueue Workload (named after its pod group) says whether Kueue admitted the
    # gang, which the inference replicas wait for (get); once the gang is no longer wanted it is
    # deleted, since Kueue keeps a serving group's Workload and quota after its pods' owners go.
    ("kueue.x-k8s.io", "workloads", ("get", "delete")),
]

SECRET_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    # Each run's Secret `<run>-auth`, written blind (apply creates or patches it) and deleted by
    # name: no get, list or watch, so the operator reads no Secret (rlrun.operator.auth).
    ("", "secrets", ("create", "patch", "delete")),
]


def permission_set(rules: list[tuple[str, str, tuple[str, ...]]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for group, resource, verbs in rules for verb in verbs}
