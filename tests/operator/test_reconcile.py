"""Pure reconciliation: RLRun specs -> Kubernetes objects, checked object by object, and every
rendered object validated against the official Kubernetes schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import copy
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate.utils
import pytest
import yaml

from rlrun.common.config import RunConfig, resolve_config
from rlrun.common.config.run import apply_override
from rlrun.operator.reconcile import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_READS,
    ENV_SERVER,
    GPU,
    INFERENCE,
    LIVE_CONFIG_KEYS,
    MODEL_SERVER,
    ORCHESTRATOR,
    TRAINER,
    Defaults,
    desired_state,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "operator" / "samples").glob("*.yaml")) + [REPO / "configs" / "k8s" / "rlrun.yaml"]
K8S_VERSIONS = ("1.33.0", "1.37.0")
"""The oldest Kubernetes the objects must suit, and the newest kubernetes-validate knows."""
UID = "0b7c6a4e-1111-4222-8333-944455556666"

BASE_CONFIG = """
name = "t"
[model]
max_model_len = 32
[orchestrator]
max_steps = 10
[orchestrator.train.sampling]
max_completion_tokens = 12
[[orchestrator.train.env]]
id = "reverse-text"
"""


def load(path: Path) -> dict:
    run = yaml.safe_load(path.read_text())
    run["metadata"]["uid"] = UID
    return run


def make_run(name: str = "r", config: str = BASE_CONFIG, **spec) -> dict:
    return {
        "apiVersion": "rlrun.dev/v1alpha1",
        "kind": "RLRun",
        "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": 1},
        "spec": {"config": config, **spec},
    }


def objects(state) -> dict[tuple[str, str], dict]:
    assert state.error is None, state.error
    return {(o["kind"], o["metadata"]["name"]): o for o in state.objects}


def container(obj: dict) -> dict:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def rendered(state) -> dict:
    return tomllib.loads(state.rendered.toml)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("suspend", [False, True])
def test_every_rendered_object_passes_kubernetes_validate_strict(path, suspend):
    run = load(path)
    run["spec"]["suspend"] = suspend
    state = desired_state(run)
    assert state.error is None, state.error
    assert state.objects
    for obj in state.objects:
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_object_is_owned_labelled_and_restricted(path):
    run = load(path)
    run["spec"]["suspend"] = False
    for obj in desired_state(run).objects:
        meta = obj["metadata"]
        assert meta["namespace"] == run["metadata"]["namespace"]
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "rlrun.dev/v1alpha1",
            "kind": "RLRun",
            "name": run["metadata"]["name"],
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "rlrun"
        assert labels["app.kubernetes.io/instance"] == run["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "rlrun-operator"
        assert labels["app.kubernetes.io/part-of"] == "rlrun"
        assert "app.kubernetes.io/component" in labels
        if obj["kind"] in ("StatefulSet", "Deployment"):
            spec = pod(obj)
            security = spec["securityContext"]
            assert security["runAsNonRoot"] is True and security["seccompProfile"] == {
                "type": "RuntimeDefault"
            }
            assert spec["automountServiceAccountToken"] is False
            c = container(obj)
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()


def test_sample_reverse_text_on_cpu_nodes():
    state = desired_state(load(REPO / "configs" / "k8s" / "rlrun.yaml"))
    objs = objects(state)
    inference = objs[("StatefulSet", "reverse-text-inference")]
    trainer = objs[("StatefulSet", "reverse-text-trainer")]
    # The demo's model trains on CPU: no GPU asked for, no GPU toleration.
    for workload in (inference, trainer):
        assert GPU not in container(workload)["resources"].get("limits", {})
        assert "tolerations" not in pod(workload)
    assert container(inference)["args"][:2] == ["serve", "inference"]
    assert container(inference)["args"][2:] == [
        "--config",
        "/etc/rlrun/config.toml",
        "--host",
        "0.0.0.0",
        "--port",
        "50051",
        "--metrics-port",
        "9090",
    ]
    assert container(inference)["readinessProbe"]["grpc"] == {"port": 50051}
    assert container(inference)["livenessProbe"]["grpc"] == {"port": 50051}
    assert objs[("Service", "reverse-text-inference")]["spec"]["clusterIP"] == "None"
    env = objs[("Deployment", "reverse-text-env-reverse-text")]
    assert container(env)["args"][:2] == ["serve", "env-server"]
    assert container(env)["args"][-2:] == ["--env", "reverse-text"]
    assert objs[("Deployment", "reverse-text-orchestrator")]["spec"]["strategy"] == {"type": "Recreate"}
    assert objs[("PersistentVolumeClaim", "reverse-text-checkpoints")]["spec"]["resources"]["requests"] == {
        "storage": "10Gi"
    }
    volumes = {v["name"]: v for v in pod(trainer)["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "reverse-text-checkpoints"}

    toml = rendered(state)
    domain = "default.svc.cluster.local"
    assert toml["inference"]["addresses"] == [
        f"reverse-text-inference-0.reverse-text-inference.{domain}:50051"
    ]
    assert toml["trainer"]["address"] == f"reverse-text-trainer-0.reverse-text-trainer.{domain}:50051"
    assert toml["orchestrator"]["address"] == f"reverse-text-orchestrator.{domain}:50051"
    assert (
        toml["orchestrator"]["train"]["env"][0]["address"]
        == f"dns:///reverse-text-env-reverse-text.{domain}:50051"
    )
    assert toml["orchestrator"]["train"]["env"][0]["pool"] == {"type": "static", "num_workers": 2}
    assert "device" not in toml["inference"] and "device" not in toml["trainer"]
    assert toml["output_dir"] == "/data/reverse-text"
    # The run file the pods read is a valid run config.
    config, _ = resolve_config(copy.deepcopy(toml))
    assert config.orchestrator.max_steps == 100
    config_map = objs[("ConfigMap", "reverse-text-config")]
    assert config_map["data"]["config.toml"] == state.rendered.toml


def test_gpu_placement_merges_global_and_component_settings():
    run = make_run(
        inference={
            "replicas": 3,
            "engine": "vllm",
            "gpusPerReplica": 2,
            "resources": {"requests": {"cpu": "4", GPU: 7}, "limits": {"memory": "32Gi"}},
            "placement": {
                "nodeSelector": {"gpu": "h100"},
                "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                },
                "topologySpread": [{"topologyKey": "topology.kubernetes.io/zone"}],
            },
        },
        placement={
            "nodeSelector": {"pool": "rl", "gpu": "any"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
            "affinity": {"podAffinity": {}},
        },
    )
    state = desired_state(run)
    objs = objects(state)
    inference = objs[("StatefulSet", "r-inference")]
    spec = pod(inference)
    assert inference["spec"]["replicas"] == 3
    assert container(inference)["resources"] == {
        "requests": {"cpu": "4"},
        "limits": {"memory": "32Gi", GPU: 2},
    }
    assert spec["nodeSelector"] == {"pool": "rl", "gpu": "h100"}  # the component wins
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},
        {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert "nodeAffinity" in spec["affinity"] and "podAffinity" not in spec["affinity"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": inference["spec"]["selector"]["matchLabels"]}
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway" and spread["maxSkew"] == 1
    assert {v["name"]: v for v in spec["volumes"]}["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory"}}
    # CPU-only components get the global placement and no GPU toleration.
    orchestrator = pod(objs[("Deployment", "r-orchestrator")])
    assert orchestrator["nodeSelector"] == {"pool": "rl", "gpu": "any"}
    assert all(t["key"] != GPU for t in orchestrator["tolerations"])
    # A component that sets no resources still requests CPU and memory (ResourceQuotas).
    assert set(container(objs[("Deployment", "r-orchestrator")])["resources"]) == {"requests"}
    assert set(container(objs[("Deployment", "r-orchestrator")])["resources"]["requests"]) == {
        "cpu",
        "memory",
    }
    toml = rendered(state)
    assert toml["inference"]["engine"] == "vllm"
    assert toml["inference"]["vllm"]["tensor_parallel_size"] == 2
    assert len(toml["inference"]["addresses"]) == 3
    assert toml["inference"]["addresses"][2].startswith("r-inference-2.r-inference.ns.svc.")


def test_external_env_servers_get_no_pods_only_addresses():
    state = desired_state(load(REPO / "operator" / "samples" / "external-env.yaml"))
    objs = objects(state)
    components = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objs.values()}
    assert components == {"auth", "network", "config", "inference", "orchestrator", "trainer"}
    envs = {e.get("name") or e["id"]: e for e in rendered(state)["orchestrator"]["train"]["env"]}
    assert envs["remote-reverse"]["address"] == "reverse-text.envs.svc.cluster.local:50051"
    assert envs["alphabet-sort"]["address"] == "alphabet-sort.envs.svc.cluster.local:50051"
    assert state.rendered.env_servers == []


def test_env_servers_split_environments_and_a_default_server_hosts_the_rest():
    config = (
        BASE_CONFIG
        + '[[orchestrator.train.env]]\nid = "alphabet-sort"\n[[orchestrator.train.env]]\nid = "debate"\nname = "debate-a"\n'
    )
    run = make_run(
        config=config,
        envServers=[
            {
                "name": "sorting",
                "envs": ["alphabet-sort"],
                "replicas": 3,
                "image": "example.com/env:1",
                "pool": {"type": "elastic", "numWorkers": 2, "maxWorkers": 8},
            }
        ],
    )
    state = desired_state(run)
    objs = objects(state)
    sorting = objs[("Deployment", "r-env-sorting")]
    assert sorting["spec"]["replicas"] == 3
    assert container(sorting)["image"] == "example.com/env:1"
    assert container(sorting)["args"][-2:] == ["--env", "alphabet-sort"]
    default = objs[("Deployment", "r-env")]
    assert container(default)["args"][-4:] == ["--env", "reverse-text", "--env", "debate-a"]
    assert container(default)["image"] == Defaults().images["env-server"]
    envs = {e.get("name") or e["id"]: e for e in rendered(state)["orchestrator"]["train"]["env"]}
    assert envs["alphabet-sort"]["address"] == "dns:///r-env-sorting.ns.svc.cluster.local:50051"
    assert envs["alphabet-sort"]["pool"] == {"type": "elastic", "num_workers": 2, "max_workers": 8}
    assert (
        envs["debate-a"]["address"]
        == envs["reverse-text"]["address"]
        == "dns:///r-env.ns.svc.cluster.local:50051"
    )


def test_an_env_server_for_an_unknown_environment_is_a_config_error():
    state = desired_state(make_run(envServers=[{"name": "nope", "replicas": 1}]))
    assert state.objects == []
    assert "spec.envServers[nope]" in state.error_message and "'nope'" in state.error_message


def test_multi_node_trainer_uses_torchrun_with_c10d_rendezvous_on_pod_0():
    run = make_run(
        trainer={"nodes": 3, "gpusPerNode": 8}, storage={"size": "1Ti", "accessModes": ["ReadWriteMany"]}
    )
    state = desired_state(run)
    objs = objects(state)
    trainer = objs[("StatefulSet", "r-trainer")]
    c = container(trainer)
    assert trainer["spec"]["replicas"] == 3
    assert trainer["spec"]["podManagementPolicy"] == "Parallel"
    assert trainer["spec"]["serviceName"] == "r-trainer"
    assert c["command"] == ["torchrun"]
    args = c["args"]
    service = "r-trainer.ns.svc.cluster.local"
    assert args[args.index("--nnodes") + 1] == "3"
    assert args[args.index("--nproc-per-node") + 1] == "8"
    assert args[args.index("--rdzv-backend") + 1] == "c10d"
    assert args[args.index("--rdzv-endpoint") + 1] == f"r-trainer-0.{service}:29400"
    assert args[args.index("--local-addr") + 1] == f"$(POD_NAME).{service}"
    assert args[args.index("-m") : args.index("-m") + 4] == ["-m", "rlrun.cli", "serve", "trainer"]
    assert c["resources"]["limits"] == {GPU: 8}
    # Only rank 0 serves gRPC: no liveness or startup probe that would restart the other ranks,
    # and a readiness probe every pod can pass (see the next test); all must turn ready.
    assert "livenessProbe" not in c and "startupProbe" not in c
    assert "exec" in c["readinessProbe"]
    (workload,) = [w for w in state.workloads if w.component == "trainer"]
    assert (workload.replicas, workload.min_ready) == (3, 3)
    assert {"name": "rdzv", "containerPort": 29400, "protocol": "TCP"} in c["ports"]
    headless = objs[("Service", "r-trainer")]["spec"]
    assert headless["publishNotReadyAddresses"] is True and headless["clusterIP"] == "None"
    assert any(p["port"] == 29400 for p in headless["ports"])
    assert rendered(state)["trainer"]["address"] == f"r-trainer-0.{service}:50051"
    # ReadWriteMany: the orchestrator shares the checkpoint volume.
    orchestrator = {v["name"]: v for v in pod(objs[("Deployment", "r-orchestrator")])["volumes"]}
    assert orchestrator["data"]["persistentVolumeClaim"] == {"claimName": "r-checkpoints"}


def test_single_node_multi_gpu_trainer_uses_standalone_torchrun_and_single_gpu_none():
    c = container(objects(desired_state(make_run(trainer={"gpusPerNode": 4})))[("StatefulSet", "r-trainer")])
    assert c["command"] == ["torchrun"]
    assert c["args"][:5] == ["--standalone", "--nnodes", "1", "--nproc-per-node", "4"]
    assert "livenessProbe" in c
    c = container(objects(desired_state(make_run(trainer={"gpusPerNode": 1})))[("StatefulSet", "r-trainer")])
    assert c["command"] == ["rlrun"] and c["args"][:2] == ["serve", "trainer"]


@pytest.mark.parametrize("how", ["suspend", "finished"])
def test_suspended_or_finished_runs_keep_storage_config_and_services_but_no_pods(how):
    run = make_run(storage={"size": "10Gi"}, suspend=how == "suspend")
    state = desired_state(run, finished=how == "finished")
    kinds = sorted({kind for kind, _ in objects(state)})
    assert kinds == ["ConfigMap", "NetworkPolicy", "PersistentVolumeClaim", "Secret", "Service"]
    assert state.workloads == []
    active = objects(desired_state(make_run(storage={"size": "10Gi"})))
    assert set(objects(state)) < set(active)


def test_tls_and_token_secrets_are_mounted_and_wired_into_the_config():
    sample = load(REPO / "operator" / "samples" / "kueue-structured.yaml")
    sample["spec"]["suspend"] = False
    state = desired_state(sample)
    objs = objects(state)
    inference = objs[("StatefulSet", "structured-kueue-inference")]
    volumes = {v["name"]: v for v in pod(inference)["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": "structured-kueue-tls"}
    assert volumes["auth"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert volumes["data"] == {"name": "data", "emptyDir": {}}  # only the trainer mounts the claim
    trainer_volumes = {
        v["name"]: v for v in pod(objs[("StatefulSet", "structured-kueue-trainer")])["volumes"]
    }
    assert trainer_volumes["data"]["persistentVolumeClaim"] == {"claimName": "team-a-checkpoints"}
    assert ("PersistentVolumeClaim", "team-a-checkpoints") not in objs  # never owned
    # kubelet gRPC probes cannot speak TLS: probe the port instead.
    assert container(inference)["readinessProbe"]["tcpSocket"] == {"port": 50051}
    grpc = rendered(state)["grpc"]
    assert grpc["tls"] == {
        "cert": "/etc/rlrun/tls/tls.crt",
        "key": "/etc/rlrun/tls/tls.key",
        "ca": "/etc/rlrun/tls/ca.crt",
    }
    assert grpc["auth_token_file"] == "/etc/rlrun/auth/token"
    assert pod(inference)["serviceAccountName"] == "rl-runner"


def test_structured_config_renders_like_the_same_toml():
    structured = make_run(config=None)
    del structured["spec"]["config"]
    structured["spec"]["configSpec"] = tomllib.loads(BASE_CONFIG)
    assert desired_state(structured).rendered.toml == desired_state(make_run()).rendered.toml


def test_deprecated_keys_are_translated_with_warnings():
    old = BASE_CONFIG.replace(
        "[orchestrator.train.sampling]\nmax_completion_tokens", "[orchestrator.sampling]\nmax_tokens"
    )
    state = desired_state(make_run(config=old))
    assert any("orchestrator.sampling is deprecated" in w for w in state.rendered.warnings)
    assert rendered(state)["orchestrator"]["train"]["sampling"] == {"max_completion_tokens": 12}
    assert "sampling" not in rendered(state)["orchestrator"]


def test_fixed_model_targets_get_their_own_inference_server():
    config = (
        BASE_CONFIG
        + '[orchestrator.models.reference]\ncheckpoint = "/data/ref"\n[orchestrator.models.judge]\nkind = "rule"\n'
    )
    state = desired_state(make_run(config=config, inference={"gpusPerReplica": 1}))
    objs = objects(state)
    server = objs[("StatefulSet", "r-model-reference")]
    assert container(server)["args"][-2:] == ["--set", 'model.path="/data/ref"']
    assert container(server)["resources"]["limits"] == {GPU: 1}
    assert not [k for k in objs if "judge" in k[1]]
    models = rendered(state)["orchestrator"]["models"]
    assert models["reference"]["addresses"] == [
        "r-model-reference-0.r-model-reference.ns.svc.cluster.local:50051"
    ]
    assert "addresses" not in models["judge"]


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        (
            {"config": BASE_CONFIG.replace("max_steps = 10", "max_steps = 0")},
            "spec.config: orchestrator.max_steps",
        ),
        ({"config": "not toml ["}, "not valid TOML"),
        ({"config": BASE_CONFIG, "configSpec": {}}, "set exactly one of config and configSpec"),
        ({"config": BASE_CONFIG, "inference": {"replicas": 0}}, "spec.inference.replicas"),
        (
            {"config": BASE_CONFIG, "storage": {"size": "1Gi", "existingClaim": "x"}},
            "exactly one of size and existingClaim",
        ),
        (
            {"config": BASE_CONFIG, "envServers": [{"name": "x", "address": "a:1", "replicas": 2}]},
            "external env-server",
        ),
        ({"config": BASE_CONFIG, "bogus": 1}, "spec.bogus"),
        ({"config": BASE_CONFIG, "inference": {"engine": "torch"}, "trainer": {"gpusPerNode": 1}}, None),
    ],
)
def test_invalid_specs_yield_an_error_and_no_objects(spec, where):
    run = make_run()
    run["spec"] = spec
    state = desired_state(run)
    if where is None:
        assert state.error is None
        return
    assert state.objects == []
    assert where in state.error_message


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        (
            "[orchestrator.algorithm_args.grpo]\nbogus = 1\n",
            "spec.config: orchestrator.algorithm_args.grpo: bogus",
        ),
        (
            "[orchestrator.algorithm_args.gpro]\nx = 1\n",
            "spec.config: orchestrator.algorithm_args.gpro: a table",
        ),
    ],
)
def test_algorithm_args_are_checked_when_the_config_renders(extra, where):
    """rlrun.checks.check_algorithms runs in the operator's config rendering: a typo in an
    algorithm's args, or args for an algorithm the run does not use, fail the RLRun at once
    naming the key (the status's ConfigValid condition carries the message)."""
    config = BASE_CONFIG.replace("max_steps = 10", 'max_steps = 10\nalgorithms = ["grpo"]')
    assert desired_state(make_run(config=config)).error is None
    state = desired_state(make_run(config=config + extra))
    assert state.objects == []
    assert state.error_message.startswith(where), state.error_message
    structured = make_run(config=None, configSpec=tomllib.loads(config + extra))
    del structured["spec"]["config"]
    message = desired_state(structured).error_message
    assert message.startswith(where.replace("spec.config", "spec.configSpec")), message


def test_engine_override_that_breaks_the_config_is_a_config_error():
    ipc = BASE_CONFIG + '[inference]\nengine = "torch"\n[trainer.broadcast]\ntransport = "ipc"\n'
    assert desired_state(make_run(config=ipc)).error is None
    state = desired_state(make_run(config=ipc, inference={"engine": "vllm"}))
    assert "ipc" in state.error_message and state.objects == []


def test_run_names_that_cannot_name_children_are_refused():
    assert "metadata.name" in desired_state(make_run(name="x" * 41)).error_message
    assert "metadata.name" in desired_state(make_run(name="9lives")).error_message
    assert desired_state(make_run(name="x" * 40)).error is None


def test_config_changes_roll_the_pods_and_defaults_pick_images():
    a = objects(desired_state(make_run()))[("Deployment", "r-orchestrator")]
    b = objects(desired_state(make_run(config=BASE_CONFIG.replace("max_steps = 10", "max_steps = 11"))))[
        ("Deployment", "r-orchestrator")
    ]
    key = "rlrun.dev/config-hash"
    assert (
        a["spec"]["template"]["metadata"]["annotations"][key]
        != b["spec"]["template"]["metadata"]["annotations"][key]
    )
    defaults = Defaults(
        images={**Defaults().images, "orchestrator": "registry.local/orch:9"},
        cluster_domain="corp.local",
        pull_policy="Always",
    )
    state = desired_state(make_run(images={"trainer": "registry.local/trainer:1"}), defaults)
    objs = objects(state)
    assert container(objs[("Deployment", "r-orchestrator")])["image"] == "registry.local/orch:9"
    assert container(objs[("StatefulSet", "r-trainer")])["image"] == "registry.local/trainer:1"
    assert container(objs[("StatefulSet", "r-trainer")])["imagePullPolicy"] == "Always"
    assert rendered(state)["orchestrator"]["address"] == "r-orchestrator.ns.svc.corp.local:50051"


# --- restarts, resume and rollouts -------------------------------------------------------------


def workloads_of(state) -> dict[str, dict]:
    """Workload objects by component (one of each in these runs)."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objects(state).values()
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def config_spec(**keys) -> dict:
    """BASE_CONFIG as a structured config, with dotted keys set (`trainer__lr` is trainer.lr)."""
    raw = tomllib.loads(BASE_CONFIG)
    for key, value in keys.items():
        apply_override(raw, key.split("__"), value)
    return raw


def structured_run(spec_config: dict, **spec) -> dict:
    run = make_run(**spec)
    del run["spec"]["config"]
    run["spec"]["configSpec"] = spec_config
    return run


def rolled(before: dict, after: dict) -> set[str]:
    """Components whose pod template (and so whose pods) differ between two states."""
    a, b = workloads_of(before), workloads_of(after)
    assert a.keys() == b.keys()
    return {c for c in a if a[c]["spec"]["template"] != b[c]["spec"]["template"]}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"trainer__lr": 1e-5}, {TRAINER}),
        ({"trainer__checkpoint__interval": 5}, {TRAINER}),
        ({"inference__num_threads": 2}, {INFERENCE}),
        # [limits]' defaults derive from it, and every service bounds its requests by them.
        ({"inference__max_batch_size": 7}, {INFERENCE, ENV_SERVER, ORCHESTRATOR, TRAINER}),
        ({"orchestrator__max_steps": 11}, {ORCHESTRATOR, TRAINER}),
        ({"orchestrator__train__sampling__temperature": 0.5}, {ORCHESTRATOR, ENV_SERVER}),
        ({"model__max_model_len": 64}, {INFERENCE, ENV_SERVER, ORCHESTRATOR, TRAINER}),
        ({"log_level": "DEBUG"}, {INFERENCE, ENV_SERVER, ORCHESTRATOR, TRAINER}),
    ],
    ids=lambda v: ",".join(sorted(v)) if isinstance(v, set) else next(iter(v)),
)
def test_a_config_change_rolls_only_the_components_that_read_it(change, expected):
    base = desired_state(structured_run(config_spec()))
    changed = desired_state(structured_run(config_spec(**change)))
    assert base.rendered.toml != changed.rendered.toml
    assert rolled(base, changed) == expected
    annotations = {
        c: w["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        for c, w in workloads_of(changed).items()
    }
    assert len(set(annotations.values())) == len(annotations)  # each component its own hash


def test_scaling_inference_restarts_nothing_and_rewrites_only_the_addresses():
    one = desired_state(make_run(inference={"replicas": 1}))
    three = desired_state(make_run(inference={"replicas": 3}))
    assert rolled(one, three) == set()  # not even the inference pods already running
    assert workloads_of(three)[INFERENCE]["spec"]["replicas"] == 3
    before, after = rendered(one), rendered(three)
    assert len(after["inference"]["addresses"]) == 3
    del before["inference"]["addresses"], after["inference"]["addresses"]
    assert before == after
    # The run file reaches the pods as a directory mount, which kubelet updates in place
    # (a subPath mount would keep the old addresses until the pod restarts).
    for workload in workloads_of(three).values():
        (mount,) = [m for m in container(workload)["volumeMounts"] if m["name"] == "config"]
        assert "subPath" not in mount and mount["mountPath"] == "/etc/rlrun"
        assert f"{mount['mountPath']}/config.toml" in container(workload)["args"]


def test_a_model_server_rolls_with_inference_settings_only():
    models = '[orchestrator.models.reference]\ncheckpoint = "/data/ref"\n'
    base = desired_state(make_run(config=BASE_CONFIG + models))
    batch = desired_state(make_run(config=BASE_CONFIG + models + "[inference]\nnum_threads = 2\n"))
    lr = desired_state(make_run(config=BASE_CONFIG + models + "[trainer]\nlr = 1e-5\n"))
    assert rolled(base, batch) == {INFERENCE, MODEL_SERVER}
    assert rolled(base, lr) == {TRAINER}


SERVICE_CODE = {
    "inference": (INFERENCE, MODEL_SERVER),
    "env_server": (ENV_SERVER,),
    "orchestrator": (ORCHESTRATOR,),
    "trainer": (TRAINER,),
    "common": tuple(CONFIG_READS),
}


def test_the_hashed_config_covers_everything_each_service_reads():
    """Scans each service's code for reads of the run file (`config.<table>[.<key>]`): every
    one must be in that component's CONFIG_READS (or be a live key), else a change to it would
    leave the component's pods running on the old value."""
    tables = "|".join([*RunConfig.model_fields, "run_dir"])
    pattern = re.compile(rf"(?<!common\.)\bconfig\.({tables})\b(?:\.(\w+))?")
    derived = {("run_dir",): [("name",), ("output_dir",)]}
    missing = []
    for where, components in SERVICE_CODE.items():
        files = sorted((REPO / "services" / where).rglob("*.py"))
        reads = {tuple(p for p in m.groups() if p) for f in files for m in pattern.finditer(f.read_text())}
        assert reads, where
        for read in sorted(reads):
            for path in derived.get(read, [read]):
                for component in components:
                    known = (*CONFIG_READS[component], *LIVE_CONFIG_KEYS)
                    if not any(path[: len(r)] == r for r in known):
                        missing.append(f"{component} reads {'.'.join(path)} ({where})")
    assert missing == []


@pytest.mark.parametrize("trainer", [{}, {"gpusPerNode": 4}, {"nodes": 3, "gpusPerNode": 8}])
def test_the_trainer_resumes_from_the_checkpoint_claim_by_default(trainer):
    storage = {"size": "1Ti", "accessModes": ["ReadWriteMany" if trainer.get("nodes") else "ReadWriteOnce"]}
    state = desired_state(make_run(trainer=trainer, storage=storage))
    sts = workloads_of(state)[TRAINER]
    args = container(sts)["args"]
    assert args[args.index("serve") : args.index("serve") + 2] == ["serve", "trainer"]
    # The trainer resumes by default; --fresh would discard the run's checkpoints.
    assert not {"--resume", "--fresh"} & set(args)
    (mount,) = [m for m in container(sts)["volumeMounts"] if m["name"] == "data"]
    (volume,) = [v for v in pod(sts)["volumes"] if v["name"] == "data"]
    assert volume["persistentVolumeClaim"] == {"claimName": "r-checkpoints"}
    checkpoints = Path(rendered(state)["output_dir"]) / "checkpoints"
    assert checkpoints.is_relative_to(mount["mountPath"])
    # The orchestrator's state travels inside the trainer's checkpoint: it needs no claim.
    if storage["accessModes"] == ["ReadWriteOnce"]:
        (data,) = [v for v in pod(workloads_of(state)[ORCHESTRATOR])["volumes"] if v["name"] == "data"]
        assert data == {"name": "data", "emptyDir": {}}


def run_probe(command: list[str], pod_name: str, port: int) -> int:
    """Runs a rendered exec probe here, as kubelet would in the pod (this interpreter for the
    image's `python`, the given port for the pod's gRPC port)."""
    python, *args, _ = command
    assert python == "python"
    env = {"POD_NAME": pod_name, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *args, str(port)], env=env, timeout=30).returncode


def test_every_pod_of_a_multi_node_trainer_can_turn_ready():
    trainer = workloads_of(desired_state(make_run(trainer={"nodes": 3, "gpusPerNode": 8})))[TRAINER]
    probe = container(trainer)["readinessProbe"]
    command = probe["exec"]["command"]
    assert command[-1] == "50051"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # Nothing listens: pod 0 (rank 0, not serving yet) is not ready, the others are.
    assert run_probe(command, "r-trainer-0", port) != 0
    assert run_probe(command, "r-trainer-1", port) == 0
    assert run_probe(command, "r-trainer-10", port) == 0
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert run_probe(command, "r-trainer-0", server.getsockname()[1]) == 0
    assert probe["timeoutSeconds"] >= 2 and probe["periodSeconds"] >= 5


def test_disruption_budgets_only_for_workloads_of_several_interchangeable_pods():
    def budgets(state) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for o in state.objects if o["kind"] == "PodDisruptionBudget"}

    single = desired_state(make_run(storage={"size": "1Gi"}))
    assert budgets(single) == {}
    config = BASE_CONFIG + '[[orchestrator.train.env]]\nid = "alphabet-sort"\n'
    state = desired_state(
        make_run(
            config=config,
            inference={"replicas": 3},
            trainer={"nodes": 2},
            storage={"size": "1Gi", "accessModes": ["ReadWriteMany"]},
            envServers=[{"name": "sorting", "envs": ["alphabet-sort"], "replicas": 4}],
        )
    )
    found = budgets(state)
    assert set(found) == {"r-inference", "r-env-sorting"}  # not the trainer, orchestrator, r-env
    objs = objects(state)
    for name, budget in found.items():
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(budget, version, strict=True)
        workload = objs.get(("StatefulSet", name)) or objs[("Deployment", name)]
        assert budget["spec"]["selector"] == workload["spec"]["selector"]
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert budget["metadata"]["ownerReferences"][0]["uid"] == UID
    suspended = make_run(inference={"replicas": 3}, suspend=True)
    assert budgets(desired_state(suspended)) == {}


def test_every_child_name_fits_its_limit_and_stays_unique_and_stable():
    """A 40-character run with a 20-character env-server: `<run>-env-<server>` would be 65
    characters, which no Service may be; it is cut and hashed."""
    long_run, server = "r" * 40, "e" * 20
    config = BASE_CONFIG + '[[orchestrator.train.env]]\nid = "arithmetic"\n'
    spec = {
        "envServers": [
            {"name": server, "envs": ["reverse-text"]},
            {"name": "e" * 19 + "f", "envs": ["arithmetic"]},
        ],
        "inference": {"replicas": 12},
        "trainer": {"nodes": 3},
        "storage": {"size": "1Gi", "accessModes": ["ReadWriteMany"]},
    }
    state = desired_state(make_run(name=long_run, config=config, **spec))
    assert state.error is None, state.error  # the run renders (its env ids are real)
    names = [(o["kind"], o["metadata"]["name"]) for o in state.objects]
    assert len(set(names)) == len(names)
    for kind, name in names:
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
        # StatefulSet pods carry `controller-revision-hash: <name>-<10 chars>` (a label value).
        assert len(name) <= (63 - 11 if kind == "StatefulSet" else 63), (kind, name)
    env_services = sorted(
        o["metadata"]["name"]
        for o in state.objects
        if o["kind"] == "Service" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "env-server"
    )
    assert len(env_services) == 2 and env_services[0] != env_services[1]
    # The same run renders the same names; the config's addresses use them.
    again = desired_state(make_run(name=long_run, config=config, **spec))
    assert [(o["kind"], o["metadata"]["name"]) for o in again.objects] == names
    toml = state.rendered.toml
    for service in env_services:
        assert f"{service}.ns.svc.cluster.local" in toml
    for obj in state.objects:
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("storage", "ok"),
    [
        ({"size": "1Gi"}, False),
        ({"size": "1Gi", "accessModes": ["ReadWriteOnce"]}, False),
        ({"existingClaim": "shared"}, False),
        ({"size": "1Gi", "accessModes": ["ReadWriteMany"]}, True),
        ({"existingClaim": "shared", "accessModes": ["ReadWriteMany"]}, True),
        (None, True),  # checkpoints in each pod (emptyDir)
    ],
)
def test_a_multi_node_trainer_needs_a_read_write_many_volume(storage, ok):
    spec = {"trainer": {"nodes": 2}, **({"storage": storage} if storage else {})}
    state = desired_state(make_run(**spec))
    if ok:
        assert state.error is None, state.error
        return
    assert state.objects == []
    assert state.error.path == "spec.storage.accessModes"
    assert "ReadWriteMany" in state.error_message and "Multi-Attach" in state.error_message
    one_node = desired_state(make_run(trainer={"nodes": 1}, storage=storage))
    assert one_node.error is None


MODEL_CONFIG = BASE_CONFIG + '[orchestrator.models.ref]\nkind = "inference"\n'


@pytest.mark.parametrize(
    "model",
    [
        {"claim": {"claimName": "weights", "subPath": "qwen3-8b"}, "mountPath": "/models/qwen3"},
        {
            "huggingFace": {
                "id": "Qwen/Qwen3-0.6B",
                "revision": "main",
                "token": {"secretName": "hf", "key": "hf-token"},
                "cacheSize": "20Gi",
            }
        },
    ],
    ids=["claim", "hub"],
)
def test_every_pod_that_loads_the_model_mounts_it_read_only_at_the_same_path(model):
    state = desired_state(
        make_run(config=MODEL_CONFIG, model=model, trainer={"nodes": 2}, inference={"replicas": 4})
    )
    assert state.error is None, state.error
    path = rendered(state)["model"]["path"]
    mount_path = model.get("mountPath", "/models")
    assert path == (mount_path if "claim" in model else "/models/Qwen/Qwen3-0.6B")
    loaders = set()
    for obj in state.objects:
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)
        if obj["kind"] not in ("StatefulSet", "Deployment"):
            continue
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = pod(obj)
        mounts = [m for m in container(obj)["volumeMounts"] if m["name"] == "model"]
        if component in ("env-server", "orchestrator"):
            assert mounts == [] and "initContainers" not in spec
            continue
        loaders.add(component)
        (mount,) = mounts
        assert mount["mountPath"] == mount_path and mount["readOnly"] is True
        (volume,) = [v for v in spec["volumes"] if v["name"] == "model"]
        if "claim" in model:
            assert mount["subPath"] == "qwen3-8b"
            assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
            assert "initContainers" not in spec
        else:
            assert volume["persistentVolumeClaim"]["claimName"] == "r-model"
            (init,) = spec["initContainers"]
            assert init["args"] == ["Qwen/Qwen3-0.6B", "main", path]
            assert {"name": "model", "mountPath": mount_path} in init["volumeMounts"]  # the one writer
            token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "hf-token"}}}
            assert token in init["env"] and token not in container(obj)["env"]
    assert loaders == {"inference", "model-server", "trainer"}
    claims = {o["metadata"]["name"] for o in state.objects if o["kind"] == "PersistentVolumeClaim"}
    assert ("r-model" in claims) == ("huggingFace" in model)


def test_the_model_download_fetches_into_the_mounted_directory(tmp_path, monkeypatch):
    """The init container's script, run against a stand-in `snapshot_download` (nothing may
    reach the Hub): it downloads the named repository and revision into the model path, with
    the token from the Secret's variable."""
    import types

    from rlrun.operator.reconcile import MODEL_DOWNLOAD

    calls = []
    fake = types.ModuleType("huggingface_hub")
    fake.snapshot_download = lambda repo, **kwargs: calls.append((repo, kwargs))
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr(sys, "argv", ["-c", "Qwen/Qwen3-0.6B", "", str(tmp_path / "m")])
    exec(compile(MODEL_DOWNLOAD, "MODEL_DOWNLOAD", "exec"), {})
    assert calls == [
        ("Qwen/Qwen3-0.6B", {"revision": None, "local_dir": str(tmp_path / "m"), "token": "hf_secret"})
    ]


@pytest.mark.parametrize(
    ("model", "where"),
    [
        ({}, "exactly one of claim, huggingFace and image"),
        (
            {"claim": {"claimName": "w"}, "image": {"path": "/opt/m"}},
            "exactly one of claim, huggingFace and image",
        ),
        ({"image": {"path": "relative"}}, "spec.model.image.path"),
        ({"claim": {"claimName": "w", "subPath": "../x"}}, "spec.model.claim.subPath"),
        ({"huggingFace": {"id": "not a repo", "cacheSize": "1Gi"}}, "spec.model.huggingFace.id"),
        ({"huggingFace": {"id": "a/b"}}, "spec.model.huggingFace.cacheSize"),
    ],
)
def test_bad_model_sources_are_refused_naming_the_field(model, where):
    state = desired_state(make_run(model=model))
    assert state.objects == [] and where in state.error_message


def test_every_container_requests_cpu_and_memory():
    run = make_run(model={"huggingFace": {"id": "Qwen/Qwen3-0.6B", "cacheSize": "20Gi"}})
    for obj in desired_state(run).objects:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            spec = pod(obj)
            for each in [*spec["containers"], *spec.get("initContainers", [])]:
                assert {"cpu", "memory"} <= set(each["resources"]["requests"]), (
                    obj["metadata"]["name"],
                    each["name"],
                )
    # A limit without a request: no default request that could exceed it.
    limited = objects(desired_state(make_run(trainer={"resources": {"limits": {"memory": "2Gi"}}})))
    assert container(limited[("StatefulSet", "r-trainer")])["resources"]["requests"] == {"cpu": "2"}


POD_OVERRIDES = {
    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "HOME", "value": "/scratch"}],
    "envFrom": [{"secretRef": {"name": "wandb"}}],
    "volumes": [{"name": "scratch", "persistentVolumeClaim": {"claimName": "fast-scratch"}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "annotations": {"example.com/team": "a"},
    "labels": {"team": "a"},
    "serviceAccountName": "trainer-sa",
    "podTemplate": {
        "spec": {
            "runtimeClassName": "nvidia",
            "containers": [{"name": "trainer", "stdin": False, "env": [{"name": "EXTRA", "value": "1"}]}],
            "terminationGracePeriodSeconds": None,
        }
    },
}


def test_pod_customisation_per_component():
    run = make_run(trainer=POD_OVERRIDES, serviceAccountName="runner")
    objs = objects(desired_state(run))
    trainer = objs[("StatefulSet", "r-trainer")]
    main = container(trainer)
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["HOME"] == "/scratch" and env["EXTRA"] == "1"
    assert [e["name"] for e in main["env"]].count("HOME") == 1  # replaced, not duplicated
    assert main["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert {"name": "scratch", "mountPath": "/scratch"} in main["volumeMounts"]
    assert {"name": "scratch", "persistentVolumeClaim": {"claimName": "fast-scratch"}} in pod(trainer)[
        "volumes"
    ]
    meta = trainer["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "a" and meta["labels"]["rlrun.dev/run"] == "r"
    assert meta["annotations"]["example.com/team"] == "a"
    assert pod(trainer)["serviceAccountName"] == "trainer-sa"
    # podTemplate: merged by name into the trainer container, a new field, a removed one.
    assert pod(trainer)["runtimeClassName"] == "nvidia" and main["stdin"] is False
    assert "terminationGracePeriodSeconds" not in pod(trainer)
    assert main["image"] and main["securityContext"]["readOnlyRootFilesystem"] is True
    # Other components are untouched.
    orchestrator = objs[("Deployment", "r-orchestrator")]
    assert pod(orchestrator)["serviceAccountName"] == "runner"
    assert "team" not in orchestrator["spec"]["template"]["metadata"]["labels"]
    for obj in objs.values():
        for version in K8S_VERSIONS:
            kubernetes_validate.utils.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "spec.trainer", "not one of volumes"),
        ({"volumes": [{"name": "data", "emptyDir": {}}]}, "spec.trainer.volumes.0", "operator's own volumes"),
        (
            {"volumes": [{"name": "two", "emptyDir": {}, "configMap": {"name": "c"}}]},
            "spec.trainer.volumes.0",
            "exactly one source",
        ),
        ({"labels": {"rlrun.dev/run": "other"}}, "spec.trainer", "set by the operator"),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            "spec.trainer.env.0",
            "not both",
        ),
        ({"envFrom": [{"prefix": "X"}]}, "spec.trainer.envFrom.0", "exactly one of configMapRef"),
        ({"env": [{"name": "1BAD"}]}, "spec.trainer.env.0.name", "pattern"),
    ],
)
def test_bad_pod_customisation_names_the_field(overrides, path, message):
    state = desired_state(make_run(trainer=overrides))
    assert state.error is not None and not state.objects
    assert state.error.path == path and message in str(state.error), str(state.error)


def test_a_model_path_no_model_source_backs_is_refused_naming_the_field():
    """`model.path` with no spec.model: nothing would put the weights there, so the pods would
    start with no model (a plain emptyDir, or a path in no image)."""
    run = make_run(config=BASE_CONFIG.replace("[model]", '[model]\npath = "/data/my-model"'))
    state = desired_state(run)
    assert state.objects == []
    assert state.error_message.startswith(
        "spec.config.model.path: /data/my-model is backed by no model source"
    )
    assert "spec.model" in state.error_message


def test_a_model_baked_into_the_images_mounts_nothing():
    state = desired_state(make_run(model={"image": {"path": "/opt/models/qwen3"}}))
    assert state.error is None
    assert rendered(state)["model"]["path"] == "/opt/models/qwen3"
    for (kind, name), obj in objects(state).items():
        if kind in ("StatefulSet", "Deployment"):
            assert "model" not in {v["name"] for v in pod(obj).get("volumes", [])}, name
