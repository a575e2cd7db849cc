"""The whole test cluster: the control plane, kwok's simulated GPU and CPU nodes, the volume
provisioner and Kueue, started in that order and stopped in the reverse one.

`Cluster.kubectl()` and `Cluster.helm()` run the real binaries against it; `api_client()` is
the official Python client's, for the admin or for a given kubeconfig.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .agent import HTTPS_PORT, NodeAgent
from .controlplane import ControlPlane
from .kueue import Kueue
from .kwok import CPU_POOL, GPU_POOL, NodePool, start_kwok
from .processes import REPO, ClusterError, Process, tool, wait_for
from .provisioner import Provisioner, storage_class


@dataclass
class ClusterOptions:
    workdir: Path | None = None
    """Where certificates, etcd's data, logs and volumes go (a new temporary folder if None)."""
    pools: tuple[NodePool, ...] = (GPU_POOL, CPU_POOL)
    kueue: bool = True
    agent: bool = False
    """A node agent (kubecluster.agent) whose Node runs the pods bound to it as local processes;
    the API server then binds to the pod network's address, so that pods reach it."""


@dataclass
class Cluster:
    options: ClusterOptions = field(default_factory=ClusterOptions)
    control_plane: ControlPlane = field(init=False)
    processes: list[Process] = field(default_factory=list)
    provisioner: Provisioner | None = None
    agent: NodeAgent | None = None
    _owned_workdir: bool = False

    @property
    def workdir(self) -> Path:
        return self.control_plane.workdir

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    def start(self) -> Cluster:
        started = time.monotonic()
        workdir = self.options.workdir
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="rlrun-kube-"))
            self._owned_workdir = True
        workdir.mkdir(parents=True, exist_ok=True)
        # --- the node agent's hook (1/4): its pod network exists before the API server binds to it
        self.agent = NodeAgent(workdir) if self.options.agent else None
        bind_address = self.agent.create_network() if self.agent is not None else "127.0.0.1"
        self.control_plane = ControlPlane(
            workdir, bind_address=bind_address, port=HTTPS_PORT if self.agent is not None else 0
        )
        try:
            self.control_plane.start()
            self._admin = self.api_client()
            self._wait_for_bootstrap()
            self.apply([storage_class(), *(node for pool in self.options.pools for node in pool.nodes())])
            kwok = start_kwok(self.kubeconfig, self.control_plane.logs)
            self.processes.append(kwok)
            self.provisioner = Provisioner(self._admin, workdir / "volumes").start()
            if self.options.kueue:
                self._start_kueue()
            names = [node["metadata"]["name"] for pool in self.options.pools for node in pool.nodes()]
            wait_for(lambda: self._nodes_ready(names), 90, "the kwok nodes to be Ready", kwok)
            if self.agent is not None:  # the node agent's hook (2/4)
                self.agent.start(self.control_plane, self.apply)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        return self

    def _wait_for_bootstrap(self) -> None:
        """The API server's bootstrap (RBAC roles, priority classes, the default namespaces) and
        the controller-manager's service-account controller (every namespace's `default`)."""
        import kubernetes

        core = kubernetes.client.CoreV1Api(self._admin)
        wait_for(lambda: core.read_namespaced_service_account("default", "default"), 90, "default/default SA")

    def _nodes_ready(self, names: list[str]) -> bool:
        import kubernetes

        nodes = {n.metadata.name: n for n in kubernetes.client.CoreV1Api(self._admin).list_node().items}
        return all(
            name in nodes
            and any(c.type == "Ready" and c.status == "True" for c in nodes[name].status.conditions or [])
            for name in names
        )

    def _start_kueue(self) -> None:
        kueue = Kueue(self.workdir, self.kubeconfig, self.control_plane.authority)
        self.apply(kueue.crds)
        for crd in kueue.crds:
            self.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
            )
        process = kueue.start()
        self.processes.append(process)
        wait_for(lambda: _http_ok(kueue.ready_url), 120, "Kueue /readyz", process)
        self.apply(kueue.webhooks)

    # --- clients

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        return {
            "PATH": f"{Path(tool('kubectl')).parent}:/usr/bin:/bin",
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [tool("kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(kubeconfig),
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cache = self.workdir / "helm"
        env = self.env() | {
            "HELM_CACHE_HOME": str(cache / "cache"),
            "HELM_CONFIG_HOME": str(cache / "config"),
            "HELM_DATA_HOME": str(cache / "data"),
        }
        result = subprocess.run(
            [tool("helm"), *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and result.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def install_chart(self, *values: str, release: str = "rlrun", namespace: str = "rlrun-system") -> None:
        """`helm install` of the repository's chart, as a user installs it (`values`: extra
        helm arguments, e.g. --set)."""
        chart = REPO / "charts" / "rlrun"
        self.helm(
            "install",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--create-namespace",
            "--wait",
            "--timeout=300s",
            *values,
        )

    def apply(self, objects: list[dict[str, Any]], manager: str = "rlrun-test") -> None:
        """Server-side apply of `objects` as the admin."""
        if objects:
            self.kubectl(
                "apply",
                "--server-side",
                f"--field-manager={manager}",
                "-f",
                "-",
                input=yaml.safe_dump_all(objects),
            )

    def get_json(self, *args: str, kubeconfig: Path | None = None) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args, kubeconfig=kubeconfig).stdout)

    def service_account_token(self, namespace: str, name: str, seconds: int = 86400) -> str:
        """A bound token of the ServiceAccount (the TokenRequest API, as `kubectl create token`)."""
        return self.kubectl("create", "token", name, "-n", namespace, f"--duration={seconds}s").stdout.strip()

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        token = self.service_account_token(namespace, name)
        return self.control_plane.token_kubeconfig(f"sa-{namespace}-{name}", token, namespace)

    def audit_events(self) -> list[dict[str, Any]]:
        """Every request the API server has answered so far (its audit log)."""
        events = []
        with self.control_plane.audit_log.open() as log:
            for line in log:
                if line.strip():
                    events.append(json.loads(line))
        return events

    def stop(self) -> None:
        if self.agent is not None:  # the node agent's hook (3/4): its pods stop first
            self.agent.stop()
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if getattr(self, "control_plane", None) is not None:
            self.control_plane.stop()
            if self.agent is not None:  # the node agent's hook (4/4): the API server's address goes last
                self.agent.delete_network()
            if self._owned_workdir and not os.environ.get("RLRUN_KEEP_CLUSTER_DIR"):
                shutil.rmtree(self.workdir, ignore_errors=True)


def _http_ok(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200
