"""The run file an RLRun's pods read: the user's config plus what only the operator knows.

The user's TOML (`spec.config`) or structured config (`spec.configSpec`) is validated with the
same pydantic model the services use. The operator then fills in the cluster addresses
(`inference.addresses`, `trainer.address`, `orchestrator.address`, each env's `address`), the
output folder on the checkpoint volume, GPU devices, TLS/token file paths and the spec's
overrides, validates again and renders TOML with `tomli_w`. Before that it runs the checks
every entry point runs (rlrun.checks) on what the file alone says: the algorithm ids and their
`algorithm_args`, external env entries, the built-in env ids and their args. Keys the user did
not write stay unwritten, so the ConfigMap reads like the user's file.
"""

from __future__ import annotations

import copy
import hashlib
import tomllib
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from rlrun.checks import Scope, check_run
from rlrun.common.config import ConfigError, RunConfig, resolve_config, translate_deprecated
from rlrun.operator.spec import RLRunSpec

GRPC_PORT = 50051
METRICS_PORT = 9090
RDZV_PORT = 29400
CONFIG_DIR = "/etc/rlrun"
CONFIG_FILE = "config.toml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
TLS_DIR = f"{CONFIG_DIR}/tls"
AUTH_DIR = f"{CONFIG_DIR}/auth"
AUTH_FILE = f"{AUTH_DIR}/token"
API_KEY_FILE = f"{AUTH_DIR}/api-key"
TOKEN_KEY, API_KEY_KEY = "token", "api-key"
"""Keys of the run's generated Secret `<run>-auth`: the gRPC bearer token, the OpenAI API key."""
CHILD_NAME_MAX = 52
"""Longest name of a child object. A StatefulSet's pods are `<name>-<ordinal>` and carry the
label `controller-revision-hash: <name>-<10 characters>`, which must fit a 63-character label
value; Services, ConfigMaps, PVCs and PodDisruptionBudgets fit too."""
DEFAULT_ENV_SERVER = ""
"""Key of the env-server the operator adds for environments nobody else hosts."""


@dataclass(frozen=True)
class Cluster:
    """Where a run lives: used to build in-cluster DNS names."""

    name: str
    namespace: str
    domain: str = "cluster.local"

    def host(self, service: str, pod: str | None = None) -> str:
        base = f"{service}.{self.namespace}.svc.{self.domain}"
        return f"{pod}.{base}" if pod else base

    def child(self, suffix: str) -> str:
        """`<run>-<suffix>`, cut to CHILD_NAME_MAX characters with a stable hash of the whole
        name when longer (so two long names that share a prefix stay apart)."""
        name = f"{self.name}-{suffix}"
        if len(name) <= CHILD_NAME_MAX:
            return name
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        return f"{name[: CHILD_NAME_MAX - 9].rstrip('-')}-{digest}"


def auth_secret_name(cluster: Cluster) -> str:
    return cluster.child("auth")


def inference_name(cluster: Cluster) -> str:
    return cluster.child("inference")


def model_server_name(cluster: Cluster, key: str) -> str:
    return cluster.child(f"model-{dns_part(key)}")


def trainer_name(cluster: Cluster) -> str:
    return cluster.child("trainer")


def orchestrator_name(cluster: Cluster) -> str:
    return cluster.child("orchestrator")


def env_server_name(cluster: Cluster, server: str) -> str:
    return cluster.child("env") if server == DEFAULT_ENV_SERVER else cluster.child(f"env-{server}")


def dns_part(text: str) -> str:
    """A lower-case DNS-label fragment of `text` (e.g. an orchestrator.models key)."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return out[:20].strip("-") or "x"


@dataclass
class EnvServerPlan:
    """One env-server the operator runs, and the environments (keys) it hosts."""

    key: str  # spec name, or DEFAULT_ENV_SERVER
    envs: list[str]
    image: str | None = None
    replicas: int = 1


@dataclass
class ModelServerPlan:
    """An extra inference server for a fixed model target of `orchestrator.models`."""

    key: str
    checkpoint: str | None


@dataclass
class RenderedConfig:
    toml: str
    env_servers: list[EnvServerPlan]
    model_servers: list[ModelServerPlan]
    warnings: list[str] = field(default_factory=list)


def _raw_config(spec: RLRunSpec) -> dict[str, Any]:
    if spec.config is not None:
        try:
            return tomllib.loads(spec.config)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("", f"spec.config is not valid TOML: {error}") from None
    return copy.deepcopy(spec.config_spec or {})


def _strip_none(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_none(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_strip_none(v) for v in node if v is not None]
    return node


def _validate(raw: dict[str, Any], where: str) -> tuple[RunConfig, list[str]]:
    try:
        return resolve_config(copy.deepcopy(raw))
    except ConfigError as error:
        path = f"{where}: {error.path}" if error.path else where
        raise ConfigError(path, error.message) from None


def _table(raw: dict[str, Any], *keys: str) -> dict[str, Any]:
    node = raw
    for key in keys:
        node = node.setdefault(key, {})
    return node


def plan_env_servers(spec: RLRunSpec, config: RunConfig) -> tuple[dict[str, str], list[EnvServerPlan]]:
    """Which server hosts each env: returns ({env key: external address}, managed servers).

    Raises ConfigError for an env-server entry naming an environment the config lacks."""
    keys = [env.key for env in config.orchestrator.train.env]
    external: dict[str, str] = {}
    managed: list[EnvServerPlan] = []
    hosted: set[str] = set()
    for server in spec.env_servers:
        for env in server.hosted_envs:
            if env not in keys:
                raise ConfigError(
                    f"spec.envServers[{server.name}]",
                    f"hosts environment {env!r}, which is not in orchestrator.train.env (known: {keys})",
                )
            if env in hosted:
                raise ConfigError(f"spec.envServers[{server.name}]", f"environment {env!r} is hosted twice")
            hosted.add(env)
        if server.external:
            external.update({env: server.address for env in server.hosted_envs})
        else:
            managed.append(EnvServerPlan(server.name, server.hosted_envs, server.image, server.replicas or 1))
    rest = [env.key for env in config.orchestrator.train.env if env.key not in hosted and env.address is None]
    if rest:
        managed.append(EnvServerPlan(DEFAULT_ENV_SERVER, rest))
    return external, managed


def _check(config: RunConfig, where: str, trainer_ranks: int) -> None:
    """The checks of rlrun.checks that need only the file (Scope.cluster: the pods run elsewhere,
    with their own images and volumes): a typo in an algorithm's args, a table for an algorithm
    the run does not use, a misspelt built-in env id or argument fail the RLRun at once naming
    the key, instead of failing a pod at start. Ids no builtin algorithm has may be an env's
    own, and an env given as an import path is the env-server image's: the env-server checks
    those when it starts. `trainer_ranks` (the spec's) must split into context groups."""
    try:
        check_run(config, Scope.cluster(trainer_ranks))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error.path}", error.message) from None


def _refuse_hub_id(config: RunConfig, where: str) -> None:
    """One meaning of a Hub model in the cluster: spec.model.huggingFace downloads it once per
    run into a volume every pod that loads it mounts (the light images carry no huggingface_hub,
    and each pod downloading on its own would fetch it once per pod and restart)."""
    if config.model.hub_id is not None:
        raise ConfigError(
            f"{where}.model.hub_id",
            "in the cluster a Hub model is named in spec.model.huggingFace.id "
            f"(here: id: {config.model.hub_id}), which downloads it once per run",
        )


@dataclass
class _Render:
    """What the overlays read (the spec, where the run lives, the user's config as validated,
    the plans made from it) and the run file `raw` they write into."""

    spec: RLRunSpec
    cluster: Cluster
    where: str
    config: RunConfig
    raw: dict[str, Any]
    external: dict[str, str]
    """{env key: address} of the environments an external env-server hosts."""
    managed: list[EnvServerPlan]
    model_servers: list[ModelServerPlan]

    def pod_address(self, service: str, pod: str) -> str:
        return f"{self.cluster.host(service, pod)}:{GRPC_PORT}"


def _model_overlay(r: _Render) -> None:
    """The run file's `model.path` is where spec.model puts the weights; a path of the user's
    own that no model source backs is refused (the pods would start with no model)."""
    _refuse_hub_id(r.config, r.where)
    if r.spec.model is not None:
        _table(r.raw, "model")["path"] = r.spec.model.path
    elif r.config.model.path is not None:
        raise ConfigError(
            f"{r.where}.model.path",
            f"{r.config.model.path} is backed by no model source: set spec.model (a claim, a "
            "huggingFace id, or image.path for weights baked into the images); spec.model sets "
            "model.path itself",
        )


def _output_overlay(r: _Render) -> None:
    """The run's folder on the checkpoint volume."""
    mount = r.spec.storage.mount_path if r.spec.storage else "/data"
    r.raw["output_dir"] = f"{mount.rstrip('/')}/{r.cluster.name}"


def _inference_overlay(r: _Render) -> None:
    """The engine, its GPUs, the OpenAI endpoint and the replicas' per-pod addresses."""
    inference = _table(r.raw, "inference")
    if r.spec.inference.engine is not None:
        inference["engine"] = r.spec.inference.engine
    _inference_gpus(
        inference, r.spec.inference.gpus_per_replica, inference.get("engine", r.config.inference.engine)
    )
    if r.spec.inference.http_port is not None:
        _inference_http(inference, r.spec.inference.http_port, tls=r.spec.secrets.tls is not None)
    service = inference_name(r.cluster)
    inference["addresses"] = [
        r.pod_address(service, f"{service}-{i}") for i in range(r.spec.inference.replicas)
    ]


def _inference_gpus(inference: dict[str, Any], gpus: int, engine: str) -> None:
    """A GPU replica runs the torch engine on CUDA and vLLM over all its GPUs (unless the
    user's file says otherwise)."""
    if gpus and engine == "torch" and "device" not in inference:
        inference["device"] = "cuda"
    if gpus > 1 and engine == "vllm" and "tensor_parallel_size" not in inference.get("vllm", {}):
        _table(inference, "vllm")["tensor_parallel_size"] = gpus


def _inference_http(inference: dict[str, Any], port: int, *, tls: bool) -> None:
    inference["http_port"] = port
    # The run's generated API key; the user's own file would not exist in the pods.
    inference["api_key_file"] = API_KEY_FILE
    if tls:
        inference["http_tls_cert"] = f"{TLS_DIR}/tls.crt"
        inference["http_tls_key"] = f"{TLS_DIR}/tls.key"


def _trainer_overlay(r: _Render) -> None:
    trainer = _table(r.raw, "trainer")
    if r.spec.trainer.gpus_per_node and "device" not in trainer:
        trainer["device"] = "cuda"
    service = trainer_name(r.cluster)
    trainer["address"] = r.pod_address(service, f"{service}-0")


def _orchestrator_overlay(r: _Render) -> None:
    """The orchestrator's own address, each env's server (and its pool) and the fixed model
    targets' servers."""
    orchestrator = _table(r.raw, "orchestrator")
    orchestrator["address"] = f"{r.cluster.host(orchestrator_name(r.cluster))}:{GRPC_PORT}"
    server_of = {env: plan.key for plan in r.managed for env in plan.envs}
    pools = {s.name: s.pool for s in r.spec.env_servers if s.pool is not None}
    for env in orchestrator["train"]["env"]:
        key = env.get("name") or env["id"]
        if key in r.external:
            env["address"] = r.external[key]
        elif key in server_of:
            server = server_of[key]
            # dns:/// makes gRPC resolve every pod of the headless Service (not one address),
            # and round_robin (rlrun.common.grpc_client) spreads the groups over them.
            env["address"] = f"dns:///{r.cluster.host(env_server_name(r.cluster, server))}:{GRPC_PORT}"
            if server in pools:
                env["pool"] = pools[server].model_dump(exclude_none=True)
    for plan in r.model_servers:
        name = model_server_name(r.cluster, plan.key)
        orchestrator["models"][plan.key]["addresses"] = [r.pod_address(name, f"{name}-0")]


def _grpc_overlay(r: _Render) -> None:
    if r.spec.secrets.tls is not None:
        tls = _table(r.raw, "grpc", "tls")
        tls.setdefault("cert", f"{TLS_DIR}/tls.crt")
        tls.setdefault("key", f"{TLS_DIR}/tls.key")
        tls.setdefault("ca", f"{TLS_DIR}/ca.crt")
    # Every run carries its generated bearer token (the Secret `<run>-auth`, mounted by every
    # pod): a server refuses each call without it but health, and each client sends it.
    _table(r.raw, "grpc")["auth_token_file"] = AUTH_FILE


OVERLAYS = (
    _model_overlay,
    _output_overlay,
    _inference_overlay,
    _trainer_overlay,
    _orchestrator_overlay,
    _grpc_overlay,
)
"""What only the operator knows, one overlay per section of the run file, in the order the
file lists them (a table the user did not write is added where its overlay runs)."""


def _user_config(spec: RLRunSpec, where: str) -> dict[str, Any]:
    raw = _strip_none(_raw_config(spec))
    if not isinstance(raw, dict):
        raise ConfigError(where, "must be a table")
    return raw


def render_config(spec: RLRunSpec, cluster: Cluster) -> RenderedConfig:
    """Validates the user's config and renders the run file for the pods. Raises ConfigError
    (its path names `spec.config` / `spec.configSpec` and the key at fault).

    The user's file is validated as written (its errors name the user's keys) and the rendered
    one once after all the overlays (what the spec adds, such as an env-server's pool)."""
    where = "spec.config" if spec.config is not None else "spec.configSpec"
    raw = _user_config(spec, where)
    config, warnings = _validate(raw, where)
    _check(config, where, spec.trainer.ranks)
    translate_deprecated(raw)  # canonical spellings from here on (warnings already collected)
    external, managed = plan_env_servers(spec, config)
    model_servers = [
        ModelServerPlan(key, target.checkpoint)
        for key, target in config.orchestrator.models.items()
        if target.kind == "inference" and not target.addresses
    ]
    render = _Render(spec, cluster, where, config, raw, external, managed, model_servers)
    for overlay in OVERLAYS:
        overlay(render)
    _validate(raw, where)
    return RenderedConfig(tomli_w.dumps(raw), managed, model_servers, warnings)
