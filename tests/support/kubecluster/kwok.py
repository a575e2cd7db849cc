"""Simulated nodes and pods with kwok (sigs.k8s.io/kwok): the controller keeps the Nodes it
manages Ready (heartbeats on a Lease) and takes every pod the scheduler binds to them through
kwok's own stages (Running and Ready at once; gone when deleted). No container runs.

GPU nodes look like a managed GPU node pool: `nvidia.com/gpu` capacity, the NVIDIA labels, and
the `nvidia.com/gpu` NoSchedule taint (the API server's ExtendedResourceToleration admission
adds the toleration to pods that ask for GPUs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import TOOLS, ClusterError, Process, free_port, tool

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU = "nvidia.com/gpu"
NODE_LEASE_S = 40
"""A kubelet's default node lease; kwok renews it every quarter of that."""


@dataclass(frozen=True)
class NodePool:
    name: str
    count: int
    gpus: int = 0
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    def nodes(self) -> list[dict[str, Any]]:
        return [self.node(index) for index in range(self.count)]

    def node(self, index: int) -> dict[str, Any]:
        name = f"{self.name}-{index}"
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        labels = {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": f"zone-{'ab'[index % 2]}",
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            "rlrun.dev/test-pool": self.name,
            **self.labels,
        }
        taints = []
        if self.gpus:
            capacity[GPU] = str(self.gpus)
            labels |= {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(self.gpus)}
            taints.append({"key": GPU, "value": "present", "effect": "NoSchedule"})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": taints} if taints else {},
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }


GPU_POOL = NodePool(
    "gpu-node",
    count=4,
    gpus=8,
    cpu="192",
    memory="2Ti",
    labels={
        "node.kubernetes.io/instance-type": "a3-highgpu-8g",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
    },
)
"""Four 8-GPU H100 nodes, in two zones (`NodePool.node` spreads them)."""
CPU_POOL = NodePool("cpu-node", count=2, labels={"node.kubernetes.io/instance-type": "n2-standard-64"})


# What a kubelet does with a pod being deleted (since Kubernetes 1.27, KEP-3329): it stops the
# containers and writes the pod's terminal phase before the pod object goes. kwok's own stages
# skip that step; controllers that hold a finalizer until a pod is terminal (Kueue's
# `kueue.x-k8s.io/managed`) would then keep deleted pods forever. The containers exit 0, as
# rlrun's services do on SIGTERM.
POD_TERMINATE = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-terminate
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Succeeded', 'Failed']
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""


def start_kwok(kubeconfig: Path, logs: Path) -> Process:
    stages = TOOLS / "kwok" / "stages.yaml"
    if not stages.exists():
        raise ClusterError(f"{stages} is missing: run `make k8s-tools`")
    config = logs.parent / "kwok-stages.yaml"
    config.write_text(stages.read_text() + "\n---" + POD_TERMINATE)
    return Process(
        "kwok",
        [
            tool("kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={config}",
            "--manage-all-nodes=false",
            # Heartbeats on a Lease, as a kubelet's (the stages update a node's status only every
            # 10 min): without one, every node is NotReady after the node monitor's grace period,
            # and the node controller marks every pod on it not Ready, which kwok never undoes.
            f"--node-lease-duration-seconds={NODE_LEASE_S}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            # A test may write a pod's status itself, as a kubelet would (restarts, a crash loop).
            "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
            # Pod IPs from a range no real interface has: a kwok pod answers nothing.
            "--cidr=10.250.0.1/16",
            "--node-ip=10.250.0.1",
            f"--server-address=127.0.0.1:{free_port()}",
        ],
        logs,
    )
