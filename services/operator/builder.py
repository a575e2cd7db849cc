"""The run-wide parts of an RLRun's objects: names, labels, metadata, pod templates (volumes,
env, probes, placement, resources, security, the model and its download) and the run-level
objects (the claims, the run's Secret, NetworkPolicy and ConfigMap).

rlrun.operator.objects builds the generic Kubernetes objects; rlrun.operator.components wires
each component (inference, model servers, env-servers, orchestrator, trainer) from a `RunBuilder`;
rlrun.operator.reconcile puts them together (`desired_state`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rlrun.common.config import ConfigError
from rlrun.operator import kueue, objects
from rlrun.operator.auth import new_key, run_credentials
from rlrun.operator.config import (
    API_KEY_KEY,
    AUTH_DIR,
    CONFIG_DIR,
    CONFIG_FILE,
    CONFIG_PATH,
    GRPC_PORT,
    METRICS_PORT,
    TLS_DIR,
    TOKEN_KEY,
    Cluster,
    RenderedConfig,
    auth_secret_name,
)
from rlrun.operator.spec import (
    API_VERSION,
    DEFAULT_REQUESTS,
    KIND,
    EnvServerSpec,
    InferenceSpec,
    OrchestratorSpec,
    Placement,
    PodOverrides,
    Resources,
    RLRunSpec,
    SpecError,
    TrainerSpec,
)
from rlrun.operator.strategic import strategic_merge

GPU = "nvidia.com/gpu"
KUEUE_QUEUE_LABEL = kueue.QUEUE_LABEL
RUN_LABEL = "rlrun.dev/run"
ENV_SERVER_LABEL = "rlrun.dev/env-server"
MODEL_LABEL = "rlrun.dev/model"
CONFIG_HASH_ANNOTATION = "rlrun.dev/config-hash"
AUTH_HASH_ANNOTATION = "rlrun.dev/auth-hash"
"""A digest of the run's token on each pod template: a new operator key rolls every pod at once,
where pods that read the token at start would otherwise disagree with restarted ones."""
MANAGED_BY = "rlrun-operator"
ComponentSpec = InferenceSpec | TrainerSpec | OrchestratorSpec | EnvServerSpec
"""A part of the spec that describes a component's pods."""
RUN_AS = 10001
CACHE_DIR = "/var/cache/rlrun"

INFERENCE, ENV_SERVER, ORCHESTRATOR, TRAINER, MODEL_SERVER = (
    "inference",
    "env-server",
    "orchestrator",
    "trainer",
    "model-server",
)
WORKLOAD_KINDS = (("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"))
OWNED_KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    *WORKLOAD_KINDS,
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Kinds the operator lists to prune. Not the run's Secret: the operator may not list Secrets
(see rlrun.operator.auth), and the Secret lives as long as the run (the garbage collector and
the delete handler remove it by name)."""
WRITE_ONLY_KINDS = (("v1", "Secret"),)
"""Kinds applied without reading them first (see rlrun.operator.kube.apply_objects)."""

ConfigPath = tuple[str, ...]
_SHARED_READS: tuple[ConfigPath, ...] = (
    ("name",),
    ("output_dir",),
    ("log_level",),
    ("model",),
    ("grpc",),
    # Every service bounds its requests by [limits], whose defaults derive from these
    # (rlrun.common.config.limits.resolve_limits).
    ("limits",),
    ("orchestrator", "group_size"),
    ("orchestrator", "batch_size"),
    ("orchestrator", "eval"),
    ("orchestrator", "warm_start"),
    ("inference", "max_waiting"),
    ("inference", "max_batch_size"),
)
CONFIG_READS: dict[str, tuple[ConfigPath, ...]] = {
    # A replica builds the trainer's adapters ([trainer.lora]): it takes updates of them alone.
    INFERENCE: (*_SHARED_READS, ("inference",), ("trainer", "address"), ("trainer", "lora")),
    MODEL_SERVER: (*_SHARED_READS, ("inference",), ("trainer", "address"), ("trainer", "lora")),
    ENV_SERVER: (
        *_SHARED_READS,
        ("orchestrator", "train"),
        ("orchestrator", "eval"),
        ("orchestrator", "rollout_timeout_s"),
    ),
    ORCHESTRATOR: (
        *_SHARED_READS,
        ("orchestrator",),
        ("monitor",),
        ("trainer", "address"),
        ("inference", "http_addresses"),
    ),
    TRAINER: (
        *_SHARED_READS,
        ("trainer",),
        ("inference", "engine"),  # the weight transport's collective backend
        ("inference", "vllm"),
        ("orchestrator", "max_steps"),
        ("orchestrator", "warm_start"),
    ),
}
"""The tables and keys of the run file each component reads (the services' code is the truth;
tests/operator/test_reconcile.py checks this against it). A pod template carries the hash of
just these, so that a change elsewhere in the file does not restart its pods."""

LIVE_CONFIG_KEYS: tuple[ConfigPath, ...] = (("inference", "addresses"),)
"""Keys no pod template hashes: the per-pod addresses of the inference replicas change with
`spec.inference.replicas`, and scaling inference must not restart the trainer or the
orchestrator (both re-read them from the mounted file at run time).
The inference replicas themselves do not read them."""

MODEL_DOWNLOAD = """\
import os, sys
from huggingface_hub import snapshot_download
repo, revision, target = sys.argv[1], sys.argv[2] or None, sys.argv[3]
snapshot_download(repo, revision=revision, local_dir=target, token=os.environ.get("HF_TOKEN") or None)
"""
"""The init container's download (`python -c MODEL_DOWNLOAD ID REVISION DIR`): files already in
DIR are not fetched again, so only the first pod of a run downloads."""
MODEL_COMPONENTS = (INFERENCE, MODEL_SERVER, TRAINER)
"""The components that load the model's weights (and mount spec.model)."""

RANK_READINESS = """\
import os, socket, sys
if os.environ["POD_NAME"].rsplit("-", 1)[-1] == "0":
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 4).close()
"""
"""Readiness of a multi-node trainer pod (`python -c RANK_READINESS PORT`). One template serves
every pod, but only rank 0 (pod 0) serves gRPC; the other pods must turn ready all the same, or
a StatefulSet rolling update, which waits for each updated pod, would never get past the first.
So pods other than 0 pass while their container runs, and pod 0 passes once the trainer accepts
connections on its gRPC port (it listens only after building and resuming the learner)."""

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclass(frozen=True)
class Defaults:
    """Operator-wide settings (chart values): default images and the cluster DNS domain."""

    images: dict[str, str] = field(
        default_factory=lambda: {
            INFERENCE: "ghcr.io/rlrun/rlrun-inference:0.1.0",
            ENV_SERVER: "ghcr.io/rlrun/rlrun-env-server:0.1.0",
            ORCHESTRATOR: "ghcr.io/rlrun/rlrun-orchestrator:0.1.0",
            TRAINER: "ghcr.io/rlrun/rlrun-trainer:0.1.0",
        }
    )
    cluster_domain: str = "cluster.local"
    pull_policy: str | None = None
    token_key: bytes = field(default_factory=new_key, repr=False)
    """The key each run's token and API key derive from (rlrun.operator.auth). The CLI reads it
    from a file, so that a restarted operator derives the same ones; the random default suits
    tests and one-off runs."""
    operator_namespace: str | None = None
    """Where the operator runs (its pods may call a run's gRPC port for the status). None: the
    operator runs outside the cluster and no in-cluster rule is needed for it."""
    metrics_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods may scrape a run's metrics port (Prometheus), unless the run's
    spec.network.metricsNamespaces says otherwise."""


@dataclass(frozen=True)
class PodInput:
    """What one component's pod template is built from (see RunBuilder.pod_template)."""

    component: str
    selector: dict[str, str]
    labels: dict[str, str]
    args: list[str]
    image: str
    section: ComponentSpec | None
    """The component's part of the spec: its resources, placement and pod overrides (None: an
    env-server the spec does not name, which has none)."""
    command: list[str] = field(default_factory=lambda: ["rlrun"])
    gpus: int = 0
    ports: list[dict[str, Any]] = field(default_factory=list)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    use_claim: bool = False
    """Mount the checkpoint claim at the storage mount path (else a scratch volume)."""
    grace_s: int = 30

    @property
    def resources(self) -> Resources:
        return self.section.resources if self.section else Resources()

    @property
    def placement(self) -> Placement | None:
        return self.section.placement if self.section else None

    @property
    def overrides(self) -> PodOverrides:
        return self.section or PodOverrides()


@dataclass
class Workload:
    """A workload the run owns and how many ready pods it needs."""

    component: str
    kind: str
    name: str
    replicas: int
    min_ready: int


@dataclass
class DesiredState:
    objects: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    rendered: RenderedConfig | None = None
    spec: RLRunSpec | None = None
    error: ConfigError | SpecError | None = None
    """Set when the spec or config is unusable; then `objects` is empty and nothing is applied."""

    @property
    def error_message(self) -> str | None:
        return None if self.error is None else str(self.error)


def server_kind(component: str) -> str:
    """The component whose image and default requests `component` takes: a fixed model
    server is an inference server."""
    return INFERENCE if component == MODEL_SERVER else component


def dumped(models: Iterable[BaseModel]) -> list[dict[str, Any]]:
    """Kubernetes fields of the spec's pass-through models (camelCase, unset ones left out)."""
    return [model.model_dump(by_alias=True, exclude_none=True) for model in models]


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def config_part(raw: dict[str, Any], component: str) -> dict[str, Any]:
    """What `component` reads of the run file `raw`: {"table.key": value} for each of its
    `CONFIG_READS` present in the file, without the `LIVE_CONFIG_KEYS`."""
    raw = copy.deepcopy(raw)
    for *tables, key in LIVE_CONFIG_KEYS:
        node = raw
        for table in tables:
            node = node.get(table, {})
        node.pop(key, None)
    part: dict[str, Any] = {}
    for path in CONFIG_READS[component]:
        node = raw
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            part[".".join(path)] = node
    return part


class RunBuilder:
    def __init__(self, run: dict[str, Any], spec: RLRunSpec, rendered: RenderedConfig, defaults: Defaults):
        meta = run["metadata"]
        self.run = run
        self.spec = spec
        self.rendered = rendered
        self.defaults = defaults
        self.cluster = Cluster(meta["name"], meta["namespace"], defaults.cluster_domain)
        self.owner = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        self.raw_config = tomllib.loads(rendered.toml)
        self.tls = spec.secrets.tls is not None
        self.credentials = run_credentials(defaults.token_key, meta["namespace"], meta["name"], meta["uid"])

    # --- metadata ---------------------------------------------------------------------------

    def selector(self, component: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "rlrun",
            "app.kubernetes.io/instance": self.cluster.name,
            "app.kubernetes.io/component": component,
            **(extra or {}),
        }

    def labels(self, component: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Labels of every object of `component` (Kueue's go on pod templates only: see
        rlrun.operator.kueue)."""
        return {
            **self.selector(component, extra),
            "app.kubernetes.io/part-of": "rlrun",
            "app.kubernetes.io/managed-by": MANAGED_BY,
            RUN_LABEL: self.cluster.name,
        }

    def metadata(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        return objects.object_meta(name, self.cluster.namespace, labels, self.owner)

    # --- pods -------------------------------------------------------------------------------

    def image(self, component: str, override: str | None = None) -> str:
        images = self.spec.images
        chosen = {
            INFERENCE: images.inference,
            MODEL_SERVER: images.inference,
            ENV_SERVER: images.env_server,
            ORCHESTRATOR: images.orchestrator,
            TRAINER: images.trainer,
        }[component]
        return override or chosen or self.defaults.images[server_kind(component)]

    def probe(self, kind: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
        # kubelet's gRPC probes speak plaintext only; with TLS on, probe the port instead.
        action = {"tcpSocket": {"port": GRPC_PORT}} if self.tls else {"grpc": {"port": GRPC_PORT}}
        probe = {**action, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": timeout}
        if kind == "readiness":
            probe["successThreshold"] = 1
        return probe

    def packed(self, gpus: int) -> dict[str, Any]:
        """A preference for nodes that already run GPU pods of this run: the scheduler's
        default scoring spreads pods over nodes, so 4 inference replicas of 2 GPUs would take 2
        GPUs on each of four 8-GPU nodes and leave no whole node for an 8-GPU trainer pod (seen
        on a real scheduler: "Insufficient nvidia.com/gpu"). Packed, they fill two nodes."""
        return {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/instance": self.cluster.name},
                                "matchExpressions": [
                                    {
                                        "key": "app.kubernetes.io/component",
                                        "operator": "In",
                                        "values": sorted(MODEL_COMPONENTS),
                                    }
                                ],
                            },
                        },
                    }
                ]
            }
        }

    def placement(
        self, component_placement: Placement | None, selector: dict[str, str], gpus: int
    ) -> dict[str, Any]:
        base = self.spec.placement
        own = component_placement or Placement()
        pod: dict[str, Any] = {}
        node_selector = {**base.node_selector, **own.node_selector}
        if node_selector:
            pod["nodeSelector"] = node_selector
        tolerations = dumped([*base.tolerations, *own.tolerations])
        if gpus:
            tolerations.append({"key": GPU, "operator": "Exists", "effect": "NoSchedule"})
        unique: list[dict[str, Any]] = []
        for toleration in tolerations:
            if toleration not in unique:
                unique.append(toleration)
        if unique:
            pod["tolerations"] = unique
        affinity = own.affinity if own.affinity is not None else base.affinity
        if affinity is None and gpus and selector.get("app.kubernetes.io/component") in MODEL_COMPONENTS:
            affinity = self.packed(gpus)
        if affinity:
            pod["affinity"] = affinity
        spread = own.topology_spread or base.topology_spread
        if spread:
            constraints = dumped(spread)
            for constraint in constraints:
                constraint.setdefault("labelSelector", {"matchLabels": dict(selector)})
            pod["topologySpreadConstraints"] = constraints
        return pod

    def resources(self, resources: Resources, gpus: int, defaults: dict[str, str]) -> dict[str, Any]:
        # A resource with a limit and no request gets the limit as its request from the API
        # server; a default request could exceed a lower limit.
        defaults = {k: v for k, v in defaults.items() if k not in resources.limits}
        requests = {**defaults, **{k: v for k, v in resources.requests.items() if k != GPU}}
        limits = {k: v for k, v in resources.limits.items() if k != GPU}
        if gpus:
            limits[GPU] = gpus
        out: dict[str, Any] = {}
        if requests:
            out["requests"] = requests
        if limits:
            out["limits"] = limits
        return out

    def data_volume(self, use_claim: bool) -> dict[str, Any]:
        storage = self.spec.storage
        if storage is not None and use_claim:
            claim = storage.existing_claim or self.cluster.child("checkpoints")
            return {"name": "data", "persistentVolumeClaim": {"claimName": claim}}
        return {"name": "data", "emptyDir": {}}

    def pod_template(self, pod: PodInput) -> dict[str, Any]:
        """A component's pod template, put together as KubeRay's `common/pod.go` does: volumes
        and mounts, then the container, then the pod spec and its metadata, and last the
        user's `podTemplate` patch over the whole."""
        volumes, mounts, init_containers = self.pod_volumes(pod)
        containers = [self.container(pod, mounts)]
        pull_policy = self.spec.images.pull_policy or self.defaults.pull_policy
        if pull_policy:
            for each in (*containers, *init_containers):
                each["imagePullPolicy"] = pull_policy
        template = {
            "metadata": self.pod_metadata(pod),
            "spec": self.pod_spec(pod, containers, init_containers, volumes),
        }
        if pod.overrides.pod_template:
            template = strategic_merge(template, pod.overrides.pod_template)
        return template

    def pod_volumes(
        self, pod: PodInput
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """(volumes, the container's mounts, init containers): the run's own volumes, the model
        (with its download, for a Hub model), then the component's `volumes`/`volumeMounts`."""
        pairs = self.run_volumes(pod)
        volumes, mounts = [volume for volume, _ in pairs], [mount for _, mount in pairs]
        init_containers: list[dict[str, Any]] = []
        model = self.spec.model
        if model is not None and model.mounted and pod.component in MODEL_COMPONENTS:
            volume, mount, init_containers = self.model_volume(pod.image, mounts)
            volumes.append(volume)
            mounts.append(mount)
        volumes += dumped(pod.overrides.volumes)
        mounts += dumped(pod.overrides.volume_mounts)
        return volumes, mounts, init_containers

    def run_volumes(self, pod: PodInput) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(volume, mount) of what every pod of the run mounts: the run file, scratch space, the
        cache, the data volume, shared memory for GPU pods, the TLS files and the credentials."""
        storage = self.spec.storage
        # The run file is a directory mount (never subPath), so kubelet swaps in a changed
        # ConfigMap in place: a running trainer sees new `inference.addresses` without a
        # restart (see LIVE_CONFIG_KEYS).
        config = {
            "name": "config",
            "configMap": {
                "name": self.cluster.child("config"),
                "items": [{"key": CONFIG_FILE, "path": CONFIG_FILE}],
            },
        }
        pairs = [
            (config, {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}),
            ({"name": "tmp", "emptyDir": {}}, {"name": "tmp", "mountPath": "/tmp"}),
            ({"name": "cache", "emptyDir": {}}, {"name": "cache", "mountPath": CACHE_DIR}),
            (
                self.data_volume(pod.use_claim),
                {"name": "data", "mountPath": storage.mount_path if storage else "/data"},
            ),
        ]
        if pod.gpus:
            pairs.append(
                ({"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "shm", "mountPath": "/dev/shm"})
            )
        tls = self.spec.secrets.tls
        if tls is not None:
            pairs.append(
                (
                    {"name": "tls", "secret": {"secretName": tls.secret_name}},
                    {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
                )
            )
        pairs.append(self.auth_volume(pod.component))
        return pairs

    def auth_volume(self, component: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's credentials: every pod its gRPC token, only the pods that serve the OpenAI
        endpoint its API key."""
        items = [{"key": TOKEN_KEY, "path": TOKEN_KEY}]
        if component == INFERENCE and self.spec.inference.http_port is not None:
            items.append({"key": API_KEY_KEY, "path": API_KEY_KEY})
        secret = {"secretName": auth_secret_name(self.cluster), "items": items, "defaultMode": 0o440}
        return {"name": "auth", "secret": secret}, {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True}

    def pod_env(self, overrides: PodOverrides) -> list[dict[str, Any]]:
        """The container's environment: the pod's identity and the writable homes of a
        read-only root, each replaced by the component's `env` entry of the same name."""
        env = [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "RLRUN_RUN", "value": self.cluster.name},
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
            {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ]
        own = dumped(overrides.env)
        replaced = {var["name"] for var in own}
        return [var for var in env if var["name"] not in replaced] + own

    def container(self, pod: PodInput, mounts: list[dict[str, Any]]) -> dict[str, Any]:
        """The component's one container: its command, ports, environment, mounts, resources
        and probes, locked down (RESTRICTED_CONTAINER)."""
        container: dict[str, Any] = {
            "name": pod.component,
            "image": pod.image,
            "command": pod.command,
            "args": pod.args,
            "ports": [
                {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                *pod.ports,
            ],
            "env": self.pod_env(pod.overrides),
            "volumeMounts": mounts,
            "securityContext": dict(RESTRICTED_CONTAINER),
        }
        if pod.overrides.env_from:
            container["envFrom"] = dumped(pod.overrides.env_from)
        defaults = DEFAULT_REQUESTS[server_kind(pod.component)]
        container["resources"] = self.resources(pod.resources, pod.gpus, defaults)
        for kind, probe in pod.probes.items():
            container[f"{kind}Probe"] = probe
        return container

    def pod_spec(
        self,
        pod: PodInput,
        containers: list[dict[str, Any]],
        init_containers: list[dict[str, Any]],
        volumes: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """The pod spec around the containers: no API token, no service links, a restricted
        security context, the run's account, priority and pull secrets, and the placement."""
        spec = self.spec
        pod_spec: dict[str, Any] = {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": dict(RESTRICTED_POD),
            "terminationGracePeriodSeconds": pod.grace_s,
            **({"initContainers": init_containers} if init_containers else {}),
            "containers": containers,
            "volumes": volumes,
            **self.placement(pod.placement, pod.selector, pod.gpus),
        }
        service_account = pod.overrides.service_account_name or spec.service_account_name
        if service_account:
            pod_spec["serviceAccountName"] = service_account
        if spec.priority_class_name:
            pod_spec["priorityClassName"] = spec.priority_class_name
        if spec.images.pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.images.pull_secrets]
        return pod_spec

    def pod_metadata(self, pod: PodInput) -> dict[str, Any]:
        """The template's labels (the component's own win over `overrides.labels`) and
        annotations: the user's, and the hashes of what the pod reads at start (its part of
        the run file, the run's token), so that a change to either rolls the pods."""
        annotations = {
            **pod.overrides.annotations,
            CONFIG_HASH_ANNOTATION: content_hash(config_part(self.raw_config, pod.component)),
            AUTH_HASH_ANNOTATION: content_hash(self.credentials.token),
        }
        return {"labels": {**pod.overrides.labels, **pod.labels}, "annotations": annotations}

    def model_volume(
        self, image: str, mounts: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        """(volume, read-only mount, init containers) of spec.model. A Hub model gets an init
        container that downloads it into the run's cache claim, the only writer; `mounts` are
        the pod's other mounts (it needs /tmp and the cache)."""
        model = self.spec.model
        mount: dict[str, Any] = {"name": "model", "mountPath": model.mount_path, "readOnly": True}
        if model.claim is not None:
            if model.claim.sub_path:
                mount["subPath"] = model.claim.sub_path
            claim = {"claimName": model.claim.claim_name, "readOnly": True}
            return {"name": "model", "persistentVolumeClaim": claim}, mount, []
        hub = model.hugging_face
        env = [
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        ]
        if hub.token is not None:
            secret = {"name": hub.token.secret_name, "key": hub.token.key}
            env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": secret}})
        download = {
            "name": "model-download",
            "image": image,
            "command": ["python", "-c", MODEL_DOWNLOAD],
            "args": [hub.id, hub.revision or "", model.path],
            "env": env,
            "volumeMounts": [
                *(m for m in mounts if m["name"] in ("tmp", "cache")),
                {"name": "model", "mountPath": model.mount_path},
            ],
            "securityContext": dict(RESTRICTED_CONTAINER),
            "resources": {"requests": dict(DEFAULT_REQUESTS["model-download"])},
        }
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": self.cluster.child("model")}}
        return volume, mount, [download]

    def serve_args(self, service: str) -> list[str]:
        return [
            "serve",
            service,
            "--config",
            CONFIG_PATH,
            "--host",
            "0.0.0.0",
            "--port",
            str(GRPC_PORT),
            "--metrics-port",
            str(METRICS_PORT),
        ]

    def model_probes(self) -> dict[str, dict[str, Any]]:
        # Loading a large checkpoint can take many minutes: a long startup window, then tight probes.
        return {
            "startup": self.probe("startup", 10, 180),
            "readiness": self.probe("readiness", 10, 3),
            "liveness": self.probe("liveness", 20, 6),
        }

    def light_probes(self) -> dict[str, dict[str, Any]]:
        return {
            "startup": self.probe("startup", 5, 60),
            "readiness": self.probe("readiness", 10, 3),
            "liveness": self.probe("liveness", 20, 6),
        }

    # --- run-level objects ------------------------------------------------------------------

    def service(
        self,
        name: str,
        component: str,
        selector: dict[str, str],
        labels: dict[str, str],
        *,
        extra_ports: Iterable[dict[str, Any]] = (),
        publish_not_ready: bool = False,
    ) -> dict[str, Any]:
        """A component's headless Service: gRPC and metrics, plus `extra_ports`."""
        ports = [
            {
                "name": "grpc",
                "port": GRPC_PORT,
                "targetPort": "grpc",
                "protocol": "TCP",
                "appProtocol": "kubernetes.io/h2c",
            },
            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            *extra_ports,
        ]
        return objects.headless_service(
            self.metadata(name, labels), selector, ports, publish_not_ready=publish_not_ready
        )

    def model_cache(self) -> dict[str, Any] | None:
        """The claim a Hub model is downloaded into (kept while the run exists)."""
        model = self.spec.model
        if model is None or model.hugging_face is None:
            return None
        hub = model.hugging_face
        return objects.persistent_volume_claim(
            self.metadata(self.cluster.child("model"), self.labels("model")),
            hub.cache_access_modes,
            hub.cache_size,
            hub.cache_storage_class_name,
        )

    def pvc(self) -> dict[str, Any] | None:
        """The checkpoint claim, unless the spec names an existing one (or none)."""
        storage = self.spec.storage
        if storage is None or storage.existing_claim:
            return None
        return objects.persistent_volume_claim(
            self.metadata(self.cluster.child("checkpoints"), self.labels("checkpoints")),
            storage.access_modes,
            storage.size,
            storage.storage_class_name,
        )

    def auth_secret(self) -> dict[str, Any]:
        """The run's credentials (rlrun.operator.auth). Users read the API key from it (`kubectl
        get secret <run>-auth`), as do clients in the namespaces spec.network admits."""
        data = {TOKEN_KEY: self.credentials.token, API_KEY_KEY: self.credentials.api_key}
        return objects.secret(self.metadata(auth_secret_name(self.cluster), self.labels("auth")), data)

    def network_policy(self) -> dict[str, Any]:
        """Ingress to the run's pods (egress stays open: a Hub download, external env-servers,
        DNS). Admitted: the run's own pods on every port (gRPC between the services, the
        trainer's rendezvous); the operator on gRPC (the status poll); Prometheus on the metrics
        port; spec.network.allowedNamespaces on gRPC and the OpenAI HTTP port. Kubelet probes
        come from the pod's node, which NetworkPolicies do not block."""
        network = self.spec.network
        run_pods = {"matchLabels": {RUN_LABEL: self.cluster.name}}
        rules: list[dict[str, Any]] = [{"from": [{"podSelector": run_pods}]}]
        if self.defaults.operator_namespace:
            operator_pods = {
                "matchLabels": {"app.kubernetes.io/name": "rlrun", "app.kubernetes.io/component": "operator"}
            }
            rules.append(
                {
                    "from": objects.namespace_peers([self.defaults.operator_namespace], operator_pods),
                    "ports": objects.tcp_ports(GRPC_PORT),
                }
            )
        scrapers = network.metrics_namespaces
        if scrapers is None:
            scrapers = list(self.defaults.metrics_namespaces)
        if scrapers:
            rules.append(
                {"from": objects.namespace_peers(scrapers), "ports": objects.tcp_ports(METRICS_PORT)}
            )
        if network.allowed_namespaces:
            served = [GRPC_PORT]
            if self.spec.inference.http_port is not None:
                served.append(self.spec.inference.http_port)
            rules.append(
                {
                    "from": objects.namespace_peers(network.allowed_namespaces),
                    "ports": objects.tcp_ports(*served),
                }
            )
        return objects.network_policy(
            self.metadata(self.cluster.child("network"), self.labels("network")), run_pods, rules
        )

    def config_map(self) -> dict[str, Any]:
        return objects.config_map(
            self.metadata(self.cluster.child("config"), self.labels("config")),
            {CONFIG_FILE: self.rendered.toml},
        )
