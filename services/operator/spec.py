"""The RLRun custom resource: its spec and status as pydantic models.

These models are the single source of the CRD's OpenAPI schema (`python -m rlrun.operator.crd`)
and of the operator's own validation. Field names are camelCase on the wire (Kubernetes style)
and snake_case in Python. The run configuration itself (`spec.config` as TOML, or
`spec.configSpec` as a structured object) is validated by the same pydantic model the services
use, `rlrun.common.config.RunConfig`; see `rlrun.operator.config`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

GROUP = "rlrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLRun"
PLURAL = "rlruns"
SINGULAR = "rlrun"
SHORT_NAMES = ["rlr"]
CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = f"{GROUP}/finalizer"

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Suspended")
CONDITION_TYPES = (
    "ConfigValid",
    "InferenceReady",
    "EnvServersReady",
    "TrainerReady",
    "Admitted",
    "Progressing",
    "Degraded",
    "Restarted",
)

MAX_RUN_NAME = 40
"""Child names append suffixes such as `-env-<server>`; those longer than 52 characters are cut
and hashed (`rlrun.operator.config.Cluster.child`), and the run name itself is a label value."""

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

Quantity = int | str
Namespace = Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class SpecError(ValueError):
    """An RLRun spec the operator cannot use. `path` is the dotted camelCase path at fault."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # as the API server: "yes" is not a boolean, "3" is not an integer
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class Resources(_Model):
    """Compute resources of one container (as in a Pod's `resources`)."""

    requests: dict[str, Quantity] = {}
    """Requested resources, e.g. {cpu: 4, memory: 16Gi}. Default: DEFAULT_REQUESTS of the
    component (inference and trainer cpu 2, memory 8Gi; orchestrator and env-servers cpu 500m,
    memory 1Gi), key by key."""

    limits: dict[str, Quantity] = {}
    """Resource limits. GPU limits (`nvidia.com/gpu`) are set from the GPU counts, not here."""


DEFAULT_REQUESTS: dict[str, dict[str, str]] = {
    "inference": {"cpu": "2", "memory": "8Gi"},
    "trainer": {"cpu": "2", "memory": "8Gi"},
    "orchestrator": {"cpu": "500m", "memory": "1Gi"},
    "env-server": {"cpu": "500m", "memory": "1Gi"},
    "model-download": {"cpu": "250m", "memory": "512Mi"},
}
"""CPU and memory requests of every container that sets none (a namespace with a ResourceQuota
refuses pods without requests). A component's `resources.requests` replaces them key by key,
and a resource it limits gets no default request (the API server takes the limit); no limits
are set by default (a memory limit below a model's peak would kill the pod)."""

RESERVED_LABEL_PREFIXES = ("app.kubernetes.io/", "rlrun.dev/", "kueue.x-k8s.io/")
RESERVED_VOLUMES = ("config", "tmp", "cache", "data", "shm", "tls", "auth", "model")
"""Volumes the operator mounts itself; extra volumes take other names."""


class SecretOrConfigMapRef(_Model):
    name: str = Field(max_length=253)
    optional: bool | None = None


class EnvFrom(_Model):
    """Environment variables from every key of a ConfigMap or a Secret (as a container's
    `envFrom`); the pods read it, the operator does not."""

    config_map_ref: SecretOrConfigMapRef | None = None
    secret_ref: SecretOrConfigMapRef | None = None
    prefix: str | None = Field(None, max_length=253)

    @model_validator(mode="after")
    def _one_source(self) -> EnvFrom:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("set exactly one of configMapRef and secretRef")
        return self


class EnvVar(_Model):
    """An environment variable (as a container's `env`); it replaces the operator's variable of
    the same name."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: dict[str, Any] | None = None
    """An EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self


class VolumeMount(_Model):
    name: str = Field(max_length=63, pattern=DNS_LABEL)
    """One of this component's `volumes`."""
    mount_path: str = Field(pattern=r"^/", max_length=1024)
    read_only: bool | None = None
    sub_path: str | None = Field(None, max_length=1024, pattern=r"^([^/.][^/]*(/[^/]+)*)?$")


class Volume(_Model):
    """A Pod volume: `name` plus one source as Kubernetes defines it (persistentVolumeClaim,
    configMap, secret, emptyDir, csi, ...)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(max_length=63, pattern=DNS_LABEL)

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = sorted(self.model_extra or {})
        if len(sources) != 1:
            raise ValueError(f"volume {self.name}: set exactly one source (got {sources or 'none'})")
        if self.name in RESERVED_VOLUMES:
            raise ValueError(f"volume {self.name}: the operator's own volumes are {list(RESERVED_VOLUMES)}")
        return self


class PodOverrides(_Model):
    """What a component's pods add to what the operator renders."""

    env: list[EnvVar] = Field(default=[], max_length=128)
    """Environment variables of the main container (replacing the operator's of the same name)."""

    env_from: list[EnvFrom] = Field(default=[], max_length=32)
    volumes: list[Volume] = Field(default=[], max_length=32)
    """Extra Pod volumes."""

    volume_mounts: list[VolumeMount] = Field(default=[], max_length=32)
    """Where the main container mounts them."""

    annotations: dict[str, str] = {}
    """Pod annotations."""

    labels: dict[str, str] = {}
    """Pod labels (not app.kubernetes.io/*, rlrun.dev/* or kueue.x-k8s.io/*, which the operator
    sets)."""

    service_account_name: str | None = Field(None, max_length=253)
    """ServiceAccount of this component's pods. Default: spec.serviceAccountName."""

    pod_template: dict[str, Any] | None = None
    """A PodTemplateSpec (metadata, spec) merged over the rendered one last, as `kubectl patch
    --type strategic` merges: maps merge, lists of containers, initContainers, volumes, env,
    volumeMounts and ports merge by name (by containerPort for ports), other lists replace, and
    null removes a field."""

    @model_validator(mode="after")
    def _consistent(self) -> PodOverrides:
        volumes = {volume.name for volume in self.volumes}
        for mount in self.volume_mounts:
            if mount.name not in volumes:
                raise ValueError(f"volumeMounts: {mount.name!r} is not one of volumes {sorted(volumes)}")
        reserved = [key for key in self.labels if key.startswith(RESERVED_LABEL_PREFIXES)]
        if reserved:
            raise ValueError(f"labels: {reserved} are set by the operator")
        return self


class Toleration(_Model):
    """A Pod toleration."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class TopologySpread(_Model):
    """A topology spread constraint; `labelSelector` defaults to the component's own pods."""

    max_skew: int = Field(1, ge=1)
    topology_key: str
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "ScheduleAnyway"
    label_selector: dict[str, Any] | None = None
    """A label selector (matchLabels / matchExpressions). Default: the component's pods."""
    min_domains: int | None = Field(None, ge=1)


class Placement(_Model):
    """Where pods go. Set globally (`spec.placement`) and per component; a component's
    nodeSelector entries win over global ones, tolerations add up, and a component's affinity or
    topologySpread replaces the global one."""

    node_selector: dict[str, str] = {}
    """Node labels the pods require."""

    tolerations: list[Toleration] = Field(default=[], max_length=32)
    """Taints the pods tolerate. GPU pods always tolerate `nvidia.com/gpu`."""

    affinity: dict[str, Any] | None = None
    """A Pod affinity (nodeAffinity, podAffinity, podAntiAffinity), passed through."""

    topology_spread: list[TopologySpread] = Field(default=[], max_length=8)
    """Topology spread constraints."""


class Images(_Model):
    """Container images per service. Unset images use the operator's defaults (chart values)."""

    inference: str | None = None
    env_server: str | None = None
    orchestrator: str | None = None
    trainer: str | None = None
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    pull_secrets: list[str] = Field(default=[], max_length=16)
    """Names of image pull Secrets in the run's namespace."""


class InferenceSpec(PodOverrides):
    """Inference replicas serving the live policy (a StatefulSet behind a headless Service)."""

    replicas: int = Field(1, ge=1, le=256)
    """Replicas; each is one address in `inference.addresses`. Scaling restarts no pod: the
    trainer and the orchestrator re-read the addresses from the run file, and the env-servers
    generate where the orchestrator's requests say. With 2 or more, a PodDisruptionBudget
    lets node drains take them one at a time. Default: 1."""

    engine: Literal["torch", "vllm"] | None = None
    """Overrides `inference.engine` of the run config. Default: the config's engine."""

    gpus_per_replica: int = Field(0, ge=0, le=16)
    """`nvidia.com/gpu` per replica; with vLLM also its tensor-parallel size. Default: 0 (CPU)."""

    http_port: int | None = Field(None, ge=1024, le=65535)
    """Serve the OpenAI-compatible HTTP API on this port. Default: off."""

    resources: Resources = Resources()
    placement: Placement | None = None


class TrainerSpec(PodOverrides):
    """The trainer: one node, or several joined by torchrun (c10d rendezvous)."""

    nodes: int = Field(1, ge=1, le=256)
    """Trainer pods (torchrun nodes). Default: 1."""

    gpus_per_node: int = Field(0, ge=0, le=16)
    """`nvidia.com/gpu` per pod, and torchrun processes per node. Default: 0 (CPU)."""

    resources: Resources = Resources()
    placement: Placement | None = None

    @property
    def ranks(self) -> int:
        """The trainer's world size: one process per GPU, or one per node on CPU."""
        return self.nodes * max(self.gpus_per_node, 1)


class PoolSpec(_Model):
    """Worker pool of an env-server; overrides `pool` of the environments it hosts."""

    type: Literal["static", "elastic"] = "static"
    num_workers: int = Field(1, ge=1, le=1024)
    max_workers: int | None = Field(None, ge=1, le=1024)
    multiplex: int | None = Field(None, ge=1, le=65536)


class EnvServerSpec(PodOverrides):
    """An env-server: either one the operator runs (`image`, `replicas`, `pool`) or an external
    one (`address` only)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.address) || (!has(self.image) && !has(self.replicas) && !has(self.pool))",
                    "message": "an external env-server (address) takes no image, replicas or pool",
                }
            ]
        }
    )

    name: str = Field(max_length=20, pattern=DNS_LABEL)
    """Name of this env-server (a DNS label). Hosts the environment with this name (`name` or
    `id` of an `[[orchestrator.train.env]]` entry) unless `envs` lists others."""

    envs: list[str] = Field(default=[], max_length=64)
    """Environments (by `name` or `id`) this server hosts. Default: [name]."""

    address: str | None = Field(None, max_length=253)
    """host:port of an external env-server; then the operator runs none."""

    image: str | None = None
    """Image of this env-server. Default: images.envServer."""

    replicas: int | None = Field(None, ge=1, le=256)
    """Pods of this env-server. With 2 or more, a PodDisruptionBudget lets node drains take
    them one at a time. Default: 1."""

    pool: PoolSpec | None = None
    resources: Resources = Resources()
    placement: Placement | None = None

    @model_validator(mode="after")
    def _external_or_managed(self) -> EnvServerSpec:
        if self.address is not None and (self.image or self.replicas or self.pool):
            raise ValueError("an external env-server (address) takes no image, replicas or pool")
        return self

    @property
    def external(self) -> bool:
        return self.address is not None

    @property
    def hosted_envs(self) -> list[str]:
        return list(self.envs) or [self.name]


class OrchestratorSpec(PodOverrides):
    """The orchestrator (one pod)."""

    resources: Resources = Resources()
    placement: Placement | None = None


class StorageSpec(_Model):
    """Checkpoint storage: a new PersistentVolumeClaim (`size`) or an existing one
    (`existingClaim`). It is mounted at `mountPath` in the trainer pods (and in the orchestrator
    when ReadWriteMany); the run writes to `<mountPath>/<run name>`."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.size) != has(self.existingClaim)",
                    "message": "set exactly one of size and existingClaim",
                }
            ]
        }
    )

    size: str | None = Field(None, pattern=QUANTITY)
    """Size of the claim the operator creates, e.g. 100Gi."""

    storage_class_name: str | None = None
    """StorageClass of the claim. Default: the cluster's default class."""

    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default=["ReadWriteOnce"], min_length=1, max_length=3
    )
    """Access modes of the claim (with existingClaim: those of that claim). A trainer on more than
    one node needs ReadWriteMany; the spec is refused without it. Default: [ReadWriteOnce]."""

    existing_claim: str | None = None
    """Use this existing claim instead of creating one (it is never deleted by the operator)."""

    mount_path: str = Field("/data", pattern=r"^/.*")
    """Where the volume is mounted. Default: /data."""

    @model_validator(mode="after")
    def _one_source(self) -> StorageSpec:
        if (self.size is None) == (self.existing_claim is None):
            raise ValueError("set exactly one of size and existingClaim")
        return self


class ModelClaim(_Model):
    """A model already on a PersistentVolumeClaim in the run's namespace."""

    claim_name: str = Field(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    sub_path: str = Field("", max_length=1024, pattern=r"^([^/.][^/]*(/[^/]+)*)?$")
    """The checkpoint directory inside the claim (relative, no `..`). Default: its root."""


class SecretKey(_Model):
    secret_name: str = Field(max_length=253)
    key: str = "token"
    """Key in the Secret. Default: token."""


class HubModel(_Model):
    """A model downloaded from the Hugging Face Hub (huggingface_hub) by an init container of
    each pod that needs it, into a cache claim the run owns: the first pod downloads, the others
    find the files there (the download skips what is present)."""

    id: str = Field(max_length=200, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")
    """The repository id, e.g. Qwen/Qwen3-0.6B."""

    revision: str | None = Field(None, max_length=255)
    """A branch, tag or commit. Default: main."""

    token: SecretKey | None = None
    """A Secret holding a Hub token (gated or private models). Only the init container reads it."""

    cache_size: str = Field(pattern=QUANTITY)
    """Size of the cache claim `<run>-model`, e.g. 50Gi."""

    cache_storage_class_name: str | None = None
    """StorageClass of the cache claim. Default: the cluster's default class."""

    cache_access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default=["ReadWriteMany"], min_length=1, max_length=3
    )
    """Access modes of the cache claim; pods on several nodes need ReadWriteMany.
    Default: [ReadWriteMany]."""


class ImageModel(_Model):
    """A model baked into the inference and trainer images: nothing is mounted."""

    path: str = Field(pattern=r"^/[^.]*$", max_length=1024)
    """The checkpoint directory inside the images."""


class ModelSource(_Model):
    """Where the model comes from: a claim or the Hugging Face Hub, which inference,
    model-server and trainer pods mount read-only at `mountPath`, or the images themselves. The
    run file's `model.path` points there; a `model.path` that none of these backs is refused."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.claim), has(self.huggingFace), has(self.image)].filter(x, x).size() == 1",
                    "message": "set exactly one of claim, huggingFace and image",
                }
            ]
        }
    )

    claim: ModelClaim | None = None
    hugging_face: HubModel | None = None
    image: ImageModel | None = None
    mount_path: str = Field("/models", pattern=r"^/[^.]*$", max_length=1024)
    """Where the model is mounted (a claim or a Hub model). Default: /models."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if sum(source is not None for source in (self.claim, self.hugging_face, self.image)) != 1:
            raise ValueError("set exactly one of claim, huggingFace and image")
        return self

    @property
    def mounted(self) -> bool:
        return self.image is None

    @property
    def path(self) -> str:
        """The checkpoint directory in the pods (the run file's `model.path`)."""
        if self.image is not None:
            return self.image.path
        if self.hugging_face is not None:
            return f"{self.mount_path.rstrip('/')}/{self.hugging_face.id}"
        return self.mount_path


class TlsSecret(_Model):
    """A Secret with `tls.crt`, `tls.key` and `ca.crt` (the layout cert-manager writes for a
    Certificate), mounted into every service; the run config's `grpc.tls.cert/key/ca` point at
    it, and the OpenAI HTTP endpoint serves HTTPS with the same pair. The operator never reads
    it: it checks the orchestrator's certificate against the CA it was started with
    (`rlrun operator --grpc-tls-ca`; chart value `grpcTls`)."""

    secret_name: str = Field(max_length=253)


class Secrets(_Model):
    tls: TlsSecret | None = None


class NetworkSpec(_Model):
    """Who may connect to the run's pods. The operator writes a NetworkPolicy that admits the
    run's own pods (every port), the operator (gRPC, for the status), Prometheus (the metrics
    port) and the namespaces named here (gRPC and the OpenAI HTTP port). Kubelet probes come
    from the pod's own node, which a NetworkPolicy does not block. Every call still needs the
    run's bearer token (the Secret `<run>-auth`)."""

    allowed_namespaces: list[Namespace] = Field(default=[], max_length=64)
    """Namespaces whose pods may call the run's gRPC and OpenAI HTTP ports (e.g. where an
    external env-server or an evaluation client runs). Default: none."""

    metrics_namespaces: list[Namespace] | None = Field(None, max_length=16)
    """Namespaces whose pods may scrape the metrics port. Default: the operator's setting (chart
    value `networkPolicy.metricsNamespaces`)."""


MULTI_NODE_STORAGE_RULE = (
    "!has(self.trainer) || !has(self.trainer.nodes) || self.trainer.nodes <= 1 || !has(self.storage)"
    " || (has(self.storage.accessModes) && 'ReadWriteMany' in self.storage.accessModes)"
)
MULTI_NODE_STORAGE_MESSAGE = (
    "a trainer on more than one node mounts the checkpoint volume on every node: "
    "storage.accessModes must include ReadWriteMany (a ReadWriteOnce volume would leave the "
    "second pod waiting on Multi-Attach)"
)


class RLRunSpec(_Model):
    """Desired state of an RL post-training run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.config) != has(self.configSpec)",
                    "message": "set exactly one of config and configSpec",
                },
                {
                    "rule": MULTI_NODE_STORAGE_RULE,
                    "message": MULTI_NODE_STORAGE_MESSAGE,
                    "fieldPath": ".storage.accessModes",
                },
            ]
        }
    )

    config: str | None = Field(None, max_length=262144)
    """The run configuration as inline TOML (the same file `rlrun local` reads)."""

    config_spec: dict[str, Any] | None = None
    """The run configuration as a structured object (the TOML's tables as YAML)."""

    images: Images = Images()
    model: ModelSource | None = None
    """Where the model's weights come from (a claim or the Hugging Face Hub). Default: what the
    run config's [model] says, inside the images."""

    inference: InferenceSpec = InferenceSpec()
    trainer: TrainerSpec = TrainerSpec()

    env_servers: list[EnvServerSpec] = Field(default=[], max_length=32)
    """Env-servers. Environments not hosted here and without an `address` in the config are
    hosted by one default env-server (image images.envServer)."""

    orchestrator: OrchestratorSpec = OrchestratorSpec()
    placement: Placement = Placement()
    """Placement of every component (merged with each component's own)."""

    storage: StorageSpec | None = None
    """Checkpoint storage; the trainer resumes from its newest checkpoint here after a restart.
    Default: an emptyDir (a restarted container still resumes, but checkpoints are lost with
    the pod, so a rescheduled trainer starts over)."""

    suspend: bool = False
    """true deletes the run's pods and keeps its PVC, ConfigMap and Services."""

    queue_name: str | None = Field(None, max_length=63)
    """Kueue LocalQueue. The pods whose count the run fixes (trainer nodes, orchestrator,
    env-servers, model servers) are one Kueue pod group, admitted all or nothing; the inference
    replicas wait at zero until it is admitted, then each is a Kueue Workload of its own, so
    scaling inference restarts nothing (docs/kueue.md). Needs Kueue v0.10.0 or later with the
    `pod` integration enabled for the namespace. Without Kueue the keys are inert and the pods
    schedule as usual. Resizing the gang changes every gang pod template: suspend, resize,
    resume instead."""

    ttl_seconds_after_finished: int | None = Field(None, ge=0)
    """Delete the RLRun this long after it succeeded or failed. Default: keep it."""

    service_account_name: str | None = Field(None, max_length=253)
    """ServiceAccount of the run's pods. Default: the namespace's default account."""

    priority_class_name: str | None = Field(None, max_length=253)
    """PriorityClass of the run's pods."""

    secrets: Secrets = Secrets()
    network: NetworkSpec = NetworkSpec()

    @model_validator(mode="after")
    def _checks(self) -> RLRunSpec:
        if (self.config is None) == (self.config_spec is None):
            raise ValueError("set exactly one of config and configSpec")
        if self.trainer.nodes > 1 and self.storage is not None:
            if "ReadWriteMany" not in self.storage.access_modes:
                raise SpecError("spec.storage.accessModes", MULTI_NODE_STORAGE_MESSAGE)
        names = [server.name for server in self.env_servers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"envServers names must be unique, got duplicates {duplicates}")
        return self


class Condition(_Model):
    type: Literal[CONDITION_TYPES]  # type: ignore[valid-type]
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class RLRunStatus(_Model):
    """Observed state of the run, written by the operator."""

    phase: Literal[PHASES] | None = None  # type: ignore[valid-type]
    """Pending, Running, Succeeded, Failed or Suspended."""

    message: str | None = None
    observed_generation: int | None = None
    step: int | None = None
    """The orchestrator's RL step."""

    max_steps: int | None = None
    policy_version: int | None = None
    reward: float | None = None
    """Mean training reward of the last step."""

    eval_reward: float | None = None
    off_policy_lag: int | None = None
    tokens_per_second: float | None = None
    groups_dropped_stale: int | None = None
    last_error: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    last_progress_time: str | None = None
    """When the step last advanced."""

    restarts: dict[str, int] | None = None
    """Container restarts per component (inference, model-server, env-server, orchestrator,
    trainer), summed over its current pods as `kubectl get pods` counts them: a pod replaced by
    a new one (evicted, rescheduled) counts from 0 again. The Restarted condition says which pod
    restarted last and why; every restart also posts an Event."""

    conditions: list[Condition] = []

    @classmethod
    def from_crd(cls, status: dict[str, Any] | None) -> RLRunStatus:
        """The status as the API server holds it (camelCase; a None value reads as unset). Keys
        the schema lacks are left out, as the API server prunes them."""
        known = {field.alias or name for name, field in cls.model_fields.items()}
        return cls.model_validate({k: v for k, v in (status or {}).items() if k in known})

    def to_crd(self) -> dict[str, Any]:
        """The status as the CRD holds it: camelCase, every key present, None meaning "remove
        the key" (a merge patch's null; see rlrun.operator.status.status_patch)."""
        out = self.model_dump(by_alias=True, exclude={"conditions"})
        out["conditions"] = [c.model_dump(by_alias=True, exclude_none=True) for c in self.conditions]
        return out


def parse_spec(spec: Any) -> RLRunSpec:
    """Validates a raw spec dict; raises SpecError naming the camelCase field at fault."""
    if not isinstance(spec, dict):
        raise SpecError("spec", "must be an object")
    try:
        return RLRunSpec.model_validate(spec)
    except ValidationError as error:
        first = error.errors()[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):  # a check across fields that names its own path
            raise cause from None
        path = ".".join(["spec", *(str(p) for p in first["loc"])])
        message = first["msg"].removeprefix("Value error, ")
        raise SpecError(path, message) from None
