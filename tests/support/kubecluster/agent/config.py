"""What the agent process is told at start (one JSON file)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class AgentConfig:
    node: str
    kubeconfig: str
    folder: str
    """The agent's own folder: pods' volumes and root filesystems, container logs."""
    bridge: str
    network: str
    dns: str
    """CoreDNS's address (the bridge's), the pods' nameserver."""
    api_host: str
    api_port: int
    repo: str
    python: str
    """The interpreter of the checkout's venv: it runs rootfs.py, and the containers' programs."""
    cluster_domain: str = "cluster.local"
    capacity: dict[str, str] = field(
        default_factory=lambda: {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    )
    labels: dict[str, str] = field(default_factory=dict)
    backoff_s: float = 10.0
    max_backoff_s: float = 300.0
    volume_refresh_s: float = 5.0
    heartbeat_s: float = 10.0
    kubelet_port: int = 0
    """The port of the agent's read-only kubelet API (container logs, for `kubectl logs`)."""
    kubelet_cert: str = ""
    kubelet_key: str = ""
    client_ca: str = ""

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: Path) -> AgentConfig:
        return cls(**json.loads(path.read_text()))
