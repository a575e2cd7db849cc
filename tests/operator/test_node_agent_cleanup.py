"""Nothing of the node agent's pods outlives the agent: stopped (SIGTERM) or killed (SIGKILL), it
leaves no process, network or mount namespace, network device, mount or directory on the host.
Each test starts a cluster of its own, runs pods with every kind of volume, then looks at the
host itself (/proc, `ip link`, /proc/self/mountinfo, the file system)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubecluster import Cluster, ClusterOptions
from kubecluster.processes import wait_for

IMAGE = "ghcr.io/rlrun/rlrun-orchestrator:test"
SERVE = "import http.server; http.server.HTTPServer(('0.0.0.0', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"
WATCHED = ("/", "/etc", "/run", "/var", "/var/run", "/var/lib", "/root", "/mnt", "/srv")
"""Folders of the host where a careless runtime would create mount points."""


def pods() -> list[dict[str, Any]]:
    volumes = [
        {"name": "config", "configMap": {"name": "config"}},
        {"name": "secret", "secret": {"secretName": "secret", "defaultMode": 0o440}},
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "info",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        },
    ]
    mounts = [
        {"name": "config", "mountPath": "/etc/agent-test/config"},
        {"name": "secret", "mountPath": "/etc/agent-test/config/secret"},
        {"name": "scratch", "mountPath": "/data/scratch"},
        {"name": "info", "mountPath": "/var/lib/agent-test/info"},
    ]
    server = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "server", "namespace": "default", "labels": {"app": "server"}},
        "spec": {
            # The ServiceAccount admission adds the kube-api-access-* projected volume.
            "initContainers": [
                {"name": "init", "image": IMAGE, "command": ["python", "-c", "print('init')"]}
            ],
            "containers": [
                {
                    "name": "server",
                    "image": IMAGE,
                    "command": ["python", "-c", SERVE],
                    "workingDir": "/srv/agent-test",
                    "volumeMounts": mounts,
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }
            ],
            "volumes": volumes,
            "terminationGracePeriodSeconds": 3,
        },
    }
    crasher = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "crasher", "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "main", "image": IMAGE, "command": ["python", "-c", "raise SystemExit(1)"]}
            ]
        },
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "config", "namespace": "default"},
            "data": {"a": "1"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "secret", "namespace": "default"},
            "stringData": {"b": "2"},
        },
        server,
        crasher,
    ]


def _start_time(pid: int) -> str | None:
    """A live process's start time (None once it is gone, or a zombie: the killed agent's first
    process stays one until the cluster's stop reaps it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _processes() -> dict[int, int]:
    """pid -> parent pid of every process on the host."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def _namespaces(pids: set[int], kind: str) -> set[str]:
    found = set()
    for pid in pids:
        try:
            found.add(os.readlink(f"/proc/{pid}/ns/{kind}"))
        except OSError:
            continue
    return found


def _links() -> set[str]:
    return {
        link["ifname"]
        for link in json.loads(
            subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
        )
    }


def _listing() -> dict[str, set[str]]:
    return {folder: set(os.listdir(folder)) for folder in WATCHED if os.path.isdir(folder)}


class Footprint:
    """What the agent's pods hold on the host while they run."""

    def __init__(self, cluster: Cluster):
        agent = cluster.agent
        assert agent is not None
        (process,) = [p for p in agent.processes if p.name == "node-agent"]
        self.agent_pid = process.pid
        parents = _processes()
        tree = {process.pid}
        while True:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            if not more:
                break
            tree |= more
        started = {pid: _start_time(pid) for pid in tree}
        self.processes = {pid: start for pid, start in started.items() if start is not None}
        own = {os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt")}
        self.namespaces = (_namespaces(tree, "net") | _namespaces(tree, "mnt")) - own
        assert agent.bridge is not None
        self.bridge = agent.bridge.name
        self.links = {self.bridge} | {name for name in _links() if name.startswith("rlv")}
        self.workdir = str(cluster.workdir)
        self.agent_folder = agent.folder

    def left(self) -> list[str]:
        """What of it is still there, but the bridge (it goes with the cluster, after the API
        server that listens on its address) and the agent's folder."""
        leftovers = [f"process {pid}" for pid, start in self.processes.items() if _start_time(pid) == start]
        everyone = set(_processes())
        leftovers += [
            f"namespace {ns}"
            for ns in self.namespaces & (_namespaces(everyone, "net") | _namespaces(everyone, "mnt"))
        ]
        leftovers += [f"link {name}" for name in (self.links - {self.bridge}) & _links()]
        leftovers += [
            f"mount {line.split()[4]}"
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if self.workdir in line
        ]
        return leftovers


def _running(cluster: Cluster) -> Footprint:
    cluster.apply(pods())
    wait_for(
        lambda: _pod(cluster, "server").get("status", {}).get("containerStatuses", [{}])[0].get("ready"),
        90,
        "the server pod to be ready",
    )
    wait_for(
        lambda: (
            _pod(cluster, "crasher")
            .get("status", {})
            .get("containerStatuses", [{}])[0]
            .get("restartCount", 0)
            >= 1
        ),
        60,
        "the crasher to restart",
    )
    footprint = Footprint(cluster)
    # Each pod has a network namespace, each container a mount namespace: at least 2 + 2.
    assert len(footprint.namespaces) >= 4, footprint.namespaces
    return footprint


def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get_json("pod", name, "-n", "default")


@pytest.fixture
def cluster():
    cluster = Cluster(ClusterOptions(pools=(), kueue=False, agent=True))
    yield cluster
    cluster.stop()


def test_a_stopped_agent_leaves_nothing_behind(cluster):
    before = _listing()
    cluster.start()
    footprint = _running(cluster)
    assert cluster.agent is not None
    cluster.agent.stop()
    # The kernel frees a network namespace, and the veth pair in it, in a work queue after the
    # namespace's last process has gone: on a loaded machine a pair can outlive the agent's exit
    # by a moment, which is not something left behind.
    deadline = time.monotonic() + 10
    while footprint.left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert footprint.left() == []
    assert _listing() == before
    assert sorted(p.name for p in cluster.agent.folder.iterdir()) == ["Corefile", "config.json", "logs"]
    server = _pod(cluster, "server")["metadata"]["uid"]
    assert (cluster.agent.logs / f"default_server_{server}" / "server" / "0.log").exists()
    cluster.stop()
    assert footprint.bridge not in _links()


def test_a_killed_agent_leaves_no_pod_running(cluster):
    before = _listing()
    cluster.start()
    footprint = _running(cluster)
    os.kill(footprint.agent_pid, signal.SIGKILL)
    # The kernel ends the agent's PID namespace, and with it every pod's processes and namespaces.
    deadline = time.monotonic() + 30
    while footprint.left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert footprint.left() == []
    assert _listing() == before
    cluster.stop()  # the bridge and the pods' folders go with the cluster
    assert footprint.bridge not in _links() and not (footprint.agent_folder / "pods").exists()
