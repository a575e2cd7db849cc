"""A real Kubernetes control plane for tests and for `make cluster` (docs/testing-kubernetes.md):
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok's simulated GPU nodes, a
volume provisioner and Kueue, from the binaries `make k8s-tools` builds."""

from .cluster import Cluster, ClusterOptions
from .kwok import CPU_POOL, GPU_POOL, NodePool
from .processes import ClusterError

__all__ = ["CPU_POOL", "GPU_POOL", "Cluster", "ClusterError", "ClusterOptions", "NodePool"]
