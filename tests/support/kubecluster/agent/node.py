"""The node agent as the test cluster starts it: the pod network's bridge first (the API server
binds to its address, so that pods reach it), then CoreDNS and the agent process, which
registers its Node; stopped in the reverse order, leaving nothing behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..controlplane import CLUSTER_DOMAIN, ControlPlane
from ..processes import REPO, ClusterError, Process, wait_for
from .config import AgentConfig
from .coredns import RBAC, start_coredns
from .kubelet import SHUTDOWN_GRACE_S
from .network import Bridge

NODE_NAME = "agent-0"
NODE_LABELS = {
    "node.kubernetes.io/instance-type": "rlrun-agent",
    "rlrun.dev/test-pool": "agent",
}
SUPPORT = Path(__file__).resolve().parents[2]
HOST_TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "hostname": "hostname",
    "sleep": "coreutils",
}
"""The host's commands the agent runs, and the Debian package of each."""


def check_host() -> None:
    """Fails (never skips) when the agent cannot run here: it needs root (network and mount
    namespaces, the bridge, port 443) and a few standard commands."""
    if os.geteuid() != 0:
        raise ClusterError("the node agent needs root: it creates network and mount namespaces and a bridge")
    missing = sorted(
        {
            f"{name} (Debian package {package})"
            for name, package in HOST_TOOLS.items()
            if not shutil.which(name)
        }
    )
    if missing:
        raise ClusterError(f"the node agent needs {', '.join(missing)}: install it with apt-get")


def venv_python(repo: Path = REPO) -> Path:
    """The interpreter of the checkout's venv, which runs the agent and every container."""
    python = repo / ".venv" / "bin" / "python"
    if not python.exists():
        raise ClusterError(f"{python} is missing: run `make setup` in {repo}")
    return python


class NodeAgent:
    def __init__(self, workdir: Path, name: str = NODE_NAME):
        self.name = name
        self.folder = workdir / "agent"
        self.bridge: Bridge | None = None
        self.processes: list[Process] = []

    @property
    def logs(self) -> Path:
        """Each container's output: logs/<namespace>_<pod>_<uid>/<container>/<restart>.log."""
        return self.folder / "logs"

    def create_network(self) -> str:
        """Creates the pod network; returns the address the API server must bind to."""
        check_host()
        self.bridge = Bridge.create()
        return self.bridge.gateway

    def start(self, control_plane: ControlPlane, apply: Any) -> None:
        """Starts CoreDNS and the agent; `apply(objects)` applies objects as the admin."""
        assert self.bridge is not None, "create_network() first"
        self.folder.mkdir(parents=True, exist_ok=True)
        apply(RBAC)
        self.processes.append(start_coredns(self.bridge.gateway, control_plane, self.folder))
        authority = control_plane.authority
        pair = authority.issue(f"node-{self.name}", f"system:node:{self.name}", "system:nodes")
        serving = authority.issue(
            f"kubelet-{self.name}", f"system:node:{self.name}", hosts=(self.bridge.gateway,), server=True
        )
        python = venv_python()
        config = AgentConfig(
            node=self.name,
            kubeconfig=str(control_plane.client_kubeconfig(f"node-{self.name}", pair)),
            folder=str(self.folder),
            bridge=self.bridge.name,
            network=str(self.bridge.network),
            dns=self.bridge.gateway,
            api_host=control_plane.bind_address,
            api_port=control_plane.port,
            repo=str(REPO),
            python=str(python),
            cluster_domain=CLUSTER_DOMAIN,
            labels=dict(NODE_LABELS),
            kubelet_cert=str(serving.cert),
            kubelet_key=str(serving.key),
            client_ca=str(control_plane.ca),
        )
        path = config.save(self.folder / "config.json")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(SUPPORT), "PYTHONUNBUFFERED": "1"}
        agent = Process(
            "node-agent",
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount-proc",
                "--",
                str(python),
                "-m",
                "kubecluster.agent",
                str(path),
            ],
            control_plane.logs,
            env=env,
            cwd=self.folder,
        )
        self.processes.append(agent)
        wait_for(lambda: self._ready(control_plane), 60, f"node {self.name} to be Ready", agent)

    def _ready(self, control_plane: ControlPlane) -> bool:
        node = control_plane.get(f"/api/v1/nodes/{self.name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    def stop(self) -> None:
        """Stops the agent (every pod with it), then CoreDNS, and deletes the pods' folders (the
        container logs stay, for the test's failure messages)."""
        errors = []
        for process in reversed(self.processes):
            try:
                process.stop(grace_s=SHUTDOWN_GRACE_S + 15)
            except Exception as error:  # noqa: BLE001 - stop the rest, then report
                errors.append(error)
        self.processes.clear()
        shutil.rmtree(self.folder / "pods", ignore_errors=True)
        if errors:
            raise errors[0]

    def delete_network(self) -> None:
        """Deletes the bridge, once nothing listens on its address: without it, the address
        would route off the machine."""
        if self.bridge is not None:
            self.bridge.delete()
            self.bridge = None

    def describe_logs(self, namespace: str | None = None, lines: int = 30) -> str:
        """The tail of every container log (of `namespace`), for failure messages."""
        out = [f"container logs in {self.logs}:"]
        for log in sorted(self.logs.glob("*/*/*.log")):
            if namespace is None or log.parts[-3].startswith(f"{namespace}_"):
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {log.relative_to(self.logs)}\n" + "\n".join(tail))
        return "\n".join(out)
