"""A test-only node agent: a kubelet for the test cluster that runs each pod bound to its Node
as local processes, in namespaces of the pod's own (network, mount, PID), with the pod's
command, environment, volumes and probes, so that the pods the operator renders really run
(docs/testing-kubernetes.md)."""

from .coredns import HTTPS_PORT
from .node import NODE_NAME, NodeAgent

__all__ = ["HTTPS_PORT", "NODE_NAME", "NodeAgent"]
