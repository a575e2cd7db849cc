"""Pure reconciliation: an RLRun (as a dict) -> the Kubernetes objects it should own.

Nothing here talks to the API server, so every decision is unit-testable:

- a ConfigMap `<run>-config` with the rendered run file (`config.toml`);
- headless Services (per-pod DNS; the trainer's also publishes not-ready addresses for the
  torchrun rendezvous);
- inference replicas as a StatefulSet (stable per-pod addresses for `inference.addresses`),
  with `nvidia.com/gpu` limits; one more single-replica StatefulSet per fixed model target of
  `orchestrator.models` that has no addresses;
- env-server Deployments (one per managed `spec.envServers` entry, plus a default one for
  environments nobody else hosts);
- the orchestrator Deployment (one pod, Recreate);
- the trainer StatefulSet: `rlrun serve trainer` on one node, `torchrun` beyond (c10d
  rendezvous on pod 0, so that torch's rank order, sorted by `--local-addr`, puts rank 0 -
  the pod that serves gRPC - on pod 0);
- the checkpoint PVC, where the trainer's `<output_dir>/checkpoints` lands: `rlrun serve
  trainer` resumes from the newest complete checkpoint there by default, so a restarted or
  rescheduled trainer pod goes on where it stopped (the orchestrator's state travels inside
  the trainer's checkpoint, so the orchestrator resumes without a volume of its own);
- PodDisruptionBudgets for the workloads that run several interchangeable pods.

Each pod template carries the hash of the parts of the run file its component reads
(`CONFIG_READS`), so a change elsewhere (scaling inference rewrites `inference.addresses`)
does not restart it.

With `spec.queueName`, the pods whose count the run fixes are one Kueue pod group, admitted all
or nothing, and the inference replicas (the part a run scales) are held at zero until it is
admitted, each then a Kueue Workload of its own (rlrun.operator.kueue).

Every object carries the owner reference to the RLRun and `app.kubernetes.io/*` labels. With
`suspend: true`, or once the run has finished, the workloads are left out (their pods go away),
while the PVC, ConfigMap and Services stay.

The work is split three ways: rlrun.operator.objects builds generic Kubernetes objects,
rlrun.operator.builder the run-wide parts (labels, pod templates, the run-level objects), and
rlrun.operator.components each component's wiring; this module puts them together. Its public
names are re-exported from those modules for the operator's other parts and the tests.
"""

from __future__ import annotations

import re
from typing import Any

from rlrun.common.config import ConfigError
from rlrun.operator import kueue
from rlrun.operator.builder import (
    AUTH_HASH_ANNOTATION,
    CONFIG_HASH_ANNOTATION,
    CONFIG_READS,
    ENV_SERVER,
    ENV_SERVER_LABEL,
    GPU,
    INFERENCE,
    KUEUE_QUEUE_LABEL,
    LIVE_CONFIG_KEYS,
    MANAGED_BY,
    MODEL_COMPONENTS,
    MODEL_DOWNLOAD,
    MODEL_LABEL,
    MODEL_SERVER,
    ORCHESTRATOR,
    OWNED_KINDS,
    RANK_READINESS,
    RUN_LABEL,
    TRAINER,
    WORKLOAD_KINDS,
    WRITE_ONLY_KINDS,
    Defaults,
    DesiredState,
    PodInput,
    RunBuilder,
    Workload,
    config_part,
    content_hash,
    object_key,
)
from rlrun.operator.components import COMPONENTS
from rlrun.operator.config import Cluster, render_config
from rlrun.operator.spec import DNS_LABEL, MAX_RUN_NAME, SpecError, parse_spec

__all__ = [
    "AUTH_HASH_ANNOTATION",
    "CONFIG_HASH_ANNOTATION",
    "CONFIG_READS",
    "ENV_SERVER",
    "ENV_SERVER_LABEL",
    "GPU",
    "INFERENCE",
    "KUEUE_QUEUE_LABEL",
    "LIVE_CONFIG_KEYS",
    "MANAGED_BY",
    "MODEL_COMPONENTS",
    "MODEL_DOWNLOAD",
    "MODEL_LABEL",
    "MODEL_SERVER",
    "ORCHESTRATOR",
    "OWNED_KINDS",
    "RANK_READINESS",
    "RUN_LABEL",
    "TRAINER",
    "WORKLOAD_KINDS",
    "WRITE_ONLY_KINDS",
    "Defaults",
    "DesiredState",
    "PodInput",
    "Workload",
    "config_part",
    "content_hash",
    "desired_state",
    "object_key",
    "pod_group_name",
]


def _check_name(run: dict[str, Any]) -> None:
    name = run["metadata"]["name"]
    if len(name) > MAX_RUN_NAME or not re.match(DNS_LABEL, name):
        raise SpecError(
            "metadata.name",
            f"{name!r} must be a DNS label starting with a letter, at most {MAX_RUN_NAME} characters",
        )


def desired_state(
    run: dict[str, Any], defaults: Defaults = Defaults(), finished: bool = False, gang_admitted: bool = True
) -> DesiredState:
    """The objects an RLRun should own. `finished` (the run succeeded or failed) drops the
    workloads as `suspend` does. `gang_admitted` (for a run with spec.queueName) is whether
    Kueue admitted its pod group: until then the inference replicas are held at zero. An
    unusable spec or config yields `error` and no objects."""
    state = DesiredState()
    try:
        _check_name(run)
        spec = parse_spec(run.get("spec"))
        meta = run["metadata"]
        rendered = render_config(spec, Cluster(meta["name"], meta["namespace"], defaults.cluster_domain))
    except (SpecError, ConfigError) as error:
        state.error = error
        return state
    state.spec, state.rendered = spec, rendered
    builder = RunBuilder(run, spec, rendered, defaults)
    with_workloads = not (spec.suspend or finished)
    for claim in (builder.pvc(), builder.model_cache()):
        if claim is not None:
            state.objects.append(claim)
    state.objects.append(builder.auth_secret())
    state.objects.append(builder.network_policy())
    state.objects.append(builder.config_map())
    for component in COMPONENTS:
        component(builder, state, with_workloads)
    if spec.queue_name and with_workloads:
        sets = kueue.pod_sets(state.objects)
        if sets > kueue.MAX_POD_SETS:
            state.error = SpecError(
                "spec.queueName",
                f"the run's pods have {sets} different shapes (requests, ports, placement) outside "
                f"inference, and Kueue admits a pod group of at most {kueue.MAX_POD_SETS}: give "
                "env-servers or model servers the same resources and placement, or run without a queue",
            )
            return DesiredState(error=state.error)
        kueue.queue_for_kueue(state.objects, spec.queue_name, pod_group_name(builder.cluster), gang_admitted)
    return state


def pod_group_name(cluster: Cluster) -> str:
    """The run's Kueue pod group, and the name of the Workload Kueue makes for it."""
    return cluster.child("group")
