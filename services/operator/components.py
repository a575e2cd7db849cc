"""Per-component wiring: what each of an RLRun's components runs and how it is reached.

- inference replicas: a StatefulSet (stable per-pod addresses for `inference.addresses`), with
  `nvidia.com/gpu` limits, and a PodDisruptionBudget from two replicas;
- one single-replica StatefulSet per fixed model target of `orchestrator.models` that has no
  addresses;
- env-server Deployments (one per managed `spec.envServers` entry, plus a default one for
  environments nobody else hosts);
- the orchestrator Deployment (one pod, Recreate);
- the trainer StatefulSet: `rlrun serve trainer` on one node, `torchrun` beyond (c10d
  rendezvous on pod 0, so that torch's rank order, sorted by `--local-addr`, puts rank 0 -
  the pod that serves gRPC - on pod 0).

Each function appends the component's Service (always) and, `with_workloads`, its workload and
its `Workload` record to the state. Pods come from `RunBuilder.pod_template`, objects from
rlrun.operator.objects.
"""

from __future__ import annotations

import json
from typing import Any

from rlrun.operator import objects
from rlrun.operator.builder import (
    ENV_SERVER,
    ENV_SERVER_LABEL,
    INFERENCE,
    MODEL_LABEL,
    MODEL_SERVER,
    ORCHESTRATOR,
    RANK_READINESS,
    TRAINER,
    DesiredState,
    PodInput,
    RunBuilder,
    Workload,
)
from rlrun.operator.config import (
    GRPC_PORT,
    RDZV_PORT,
    env_server_name,
    inference_name,
    model_server_name,
    orchestrator_name,
    trainer_name,
)


def _stateful_set(
    b: RunBuilder, name: str, replicas: int, selector: dict[str, str], labels: dict[str, str], template
) -> dict[str, Any]:
    return objects.stateful_set(b.metadata(name, labels), replicas, selector, template)


def _deployment(
    b: RunBuilder,
    name: str,
    replicas: int,
    selector: dict[str, str],
    labels: dict[str, str],
    template,
    recreate: bool,
) -> dict[str, Any]:
    return objects.deployment(b.metadata(name, labels), replicas, selector, template, recreate=recreate)


def _disruption_budget(
    b: RunBuilder, name: str, replicas: int, selector: dict[str, str], labels: dict[str, str]
) -> dict[str, Any] | None:
    """A PodDisruptionBudget for a workload of interchangeable pods: a node drain or a
    consolidation takes them one at a time, and the run goes on with the others.

    None for a single pod (the orchestrator, each fixed model server, a one-replica pool):
    the only budget that would protect it (maxUnavailable 0) blocks every drain of its
    node forever, and one that admits the eviction protects nothing; the run survives
    the eviction by resuming. None for the trainer too: its pods are one torchrun job, and
    losing any one of them restarts all of them from the checkpoint, so a budget that lets
    them go one at a time protects nothing."""
    if replicas < 2:
        return None
    return objects.disruption_budget(b.metadata(name, labels), selector)


def inference(b: RunBuilder, state: DesiredState, with_workloads: bool) -> None:
    spec = b.spec.inference
    name = inference_name(b.cluster)
    selector = b.selector(INFERENCE)
    state.objects.append(
        b.service(name, INFERENCE, selector, b.labels(INFERENCE), extra_ports=_http_ports(b))
    )
    if not with_workloads:
        return
    args = b.serve_args("inference")
    ports = []
    if spec.http_port is not None:
        args += ["--http-port", str(spec.http_port)]
        ports.append({"name": "http", "containerPort": spec.http_port, "protocol": "TCP"})
    labels = b.labels(INFERENCE)
    template = _model_pod(b, INFERENCE, selector, labels, args, ports)
    state.objects.append(_stateful_set(b, name, spec.replicas, selector, labels, template))
    state.workloads.append(Workload(INFERENCE, "StatefulSet", name, spec.replicas, spec.replicas))
    budget = _disruption_budget(b, name, spec.replicas, selector, b.labels(INFERENCE))
    if budget is not None:
        state.objects.append(budget)


def _model_pod(
    b: RunBuilder,
    component: str,
    selector: dict[str, str],
    labels: dict[str, str],
    args: list[str],
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The pod template of a server of a model (the policy's replicas, a model server): the
    inference spec's image, resources, placement, GPUs and overrides, with the model probes."""
    spec = b.spec.inference
    return b.pod_template(
        PodInput(
            component=component,
            selector=selector,
            labels=labels,
            args=args,
            image=b.image(component),
            section=spec,
            gpus=spec.gpus_per_replica,
            ports=ports or [],
            probes=b.model_probes(),
        )
    )


def _http_ports(b: RunBuilder) -> list[dict[str, Any]]:
    port = b.spec.inference.http_port
    if port is None:
        return []
    return [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]


def model_servers(b: RunBuilder, state: DesiredState, with_workloads: bool) -> None:
    for plan in b.rendered.model_servers:
        name = model_server_name(b.cluster, plan.key)
        extra = {MODEL_LABEL: name.removeprefix(f"{b.cluster.name}-model-")}
        selector = b.selector(MODEL_SERVER, extra)
        state.objects.append(b.service(name, MODEL_SERVER, selector, b.labels(MODEL_SERVER, extra)))
        if not with_workloads:
            continue
        args = b.serve_args("inference")
        if plan.checkpoint:
            args += ["--set", f"model.path={json.dumps(plan.checkpoint)}"]
        labels = b.labels(MODEL_SERVER, extra)
        template = _model_pod(b, MODEL_SERVER, selector, labels, args)
        state.objects.append(_stateful_set(b, name, 1, selector, labels, template))
        state.workloads.append(Workload(INFERENCE, "StatefulSet", name, 1, 1))


def env_servers(b: RunBuilder, state: DesiredState, with_workloads: bool) -> None:
    by_name = {server.name: server for server in b.spec.env_servers}
    for plan in b.rendered.env_servers:
        name = env_server_name(b.cluster, plan.key)
        extra = {ENV_SERVER_LABEL: plan.key or "default"}
        selector = b.selector(ENV_SERVER, extra)
        state.objects.append(b.service(name, ENV_SERVER, selector, b.labels(ENV_SERVER, extra)))
        if not with_workloads:
            continue
        server = by_name.get(plan.key)
        args = b.serve_args("env-server")
        for env in plan.envs:
            args += ["--env", env]
        labels = b.labels(ENV_SERVER, extra)
        template = b.pod_template(
            PodInput(
                component=ENV_SERVER,
                selector=selector,
                labels=labels,
                args=args,
                image=b.image(ENV_SERVER, plan.image),
                section=server,
                probes=b.light_probes(),
            )
        )
        state.objects.append(_deployment(b, name, plan.replicas, selector, labels, template, recreate=False))
        state.workloads.append(Workload(ENV_SERVER, "Deployment", name, plan.replicas, plan.replicas))
        budget = _disruption_budget(b, name, plan.replicas, selector, b.labels(ENV_SERVER, extra))
        if budget is not None:
            state.objects.append(budget)


def orchestrator(b: RunBuilder, state: DesiredState, with_workloads: bool) -> None:
    name = orchestrator_name(b.cluster)
    selector = b.selector(ORCHESTRATOR)
    state.objects.append(b.service(name, ORCHESTRATOR, selector, b.labels(ORCHESTRATOR)))
    if not with_workloads:
        return
    storage = b.spec.storage
    shared = storage is not None and "ReadWriteMany" in storage.access_modes
    labels = b.labels(ORCHESTRATOR)
    template = b.pod_template(
        PodInput(
            component=ORCHESTRATOR,
            selector=selector,
            labels=labels,
            args=b.serve_args("orchestrator"),
            image=b.image(ORCHESTRATOR),
            section=b.spec.orchestrator,
            probes=b.light_probes(),
            use_claim=shared,
        )
    )
    state.objects.append(_deployment(b, name, 1, selector, labels, template, recreate=True))
    state.workloads.append(Workload(ORCHESTRATOR, "Deployment", name, 1, 1))


def trainer_command(b: RunBuilder) -> tuple[list[str], list[str]]:
    spec = b.spec.trainer
    serve = b.serve_args("trainer")
    if spec.nodes == 1 and spec.gpus_per_node <= 1:
        return ["rlrun"], serve
    per_node = str(max(spec.gpus_per_node, 1))
    if spec.nodes == 1:
        return ["torchrun"], [
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            per_node,
            "-m",
            "rlrun.cli",
            *serve,
        ]
    name = trainer_name(b.cluster)
    service = b.cluster.host(name)
    return ["torchrun"], [
        "--nnodes",
        str(spec.nodes),
        "--nproc-per-node",
        per_node,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{name}-0.{service}:{RDZV_PORT}",
        "--rdzv-id",
        f"{b.cluster.name}-{b.run['metadata']['uid'][:8]}",
        "--local-addr",
        f"$(POD_NAME).{service}",
        "--max-restarts",
        "3",
        "-m",
        "rlrun.cli",
        *serve,
    ]


def trainer(b: RunBuilder, state: DesiredState, with_workloads: bool) -> None:
    spec = b.spec.trainer
    name = trainer_name(b.cluster)
    selector = b.selector(TRAINER)
    rdzv = [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}]
    state.objects.append(
        b.service(name, TRAINER, selector, b.labels(TRAINER), extra_ports=rdzv, publish_not_ready=True)
    )
    if not with_workloads:
        return
    # `rlrun serve trainer` resumes from the newest complete checkpoint under
    # <output_dir>/checkpoints on the claim by default: no --resume, and never --fresh.
    command, args = trainer_command(b)
    if spec.nodes == 1:
        probes = b.model_probes()
    else:
        # Only rank 0 (pod 0) serves gRPC, so no liveness or startup probe (they would
        # restart the other pods), and a readiness probe that each pod answers for itb.
        probes = {
            "readiness": {
                "exec": {"command": ["python", "-c", RANK_READINESS, str(GRPC_PORT)]},
                "periodSeconds": 10,
                "failureThreshold": 3,
                "timeoutSeconds": 5,
                "successThreshold": 1,
            }
        }
    labels = b.labels(TRAINER)
    template = b.pod_template(
        PodInput(
            component=TRAINER,
            selector=selector,
            labels=labels,
            command=command,
            args=args,
            image=b.image(TRAINER),
            section=spec,
            gpus=spec.gpus_per_node,
            ports=[{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
            probes=probes,
            use_claim=True,
            grace_s=120,
        )
    )
    state.objects.append(_stateful_set(b, name, spec.nodes, selector, labels, template))
    # Every pod: pods other than 0 turn ready at once, pod 0 once it serves.
    state.workloads.append(Workload(TRAINER, "StatefulSet", name, spec.nodes, spec.nodes))


COMPONENTS = (inference, model_servers, env_servers, orchestrator, trainer)
"""Every component's wiring, in the order their objects are listed."""
