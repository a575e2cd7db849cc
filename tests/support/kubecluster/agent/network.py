"""The node's pod network: a Linux bridge on the host (10.244.N.1/24, a /24 of its own per
cluster, so that clusters of parallel test sessions never meet), and for each pod a network
namespace held by the pod's sandbox process, joined to the bridge by a veth pair. The host
reaches the pods (and kubelet's probes do) through the bridge's route; pods reach each other
on the bridge and the host (API server, CoreDNS) at the bridge's address.

Nothing of it outlives its owner: a pod's namespace, and with it the veth pair, goes when the
pod's last process does (no `ip netns add`, whose bind mounts under /run/netns would stay after
a crash), and the bridge carries its creator's pid in its alias, so that a later cluster
deletes the bridges of creators that died without cleaning up."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass

from rlrun.common.procfs import alive

from ..processes import ClusterError

ALIAS_PREFIX = "rlrun-kubecluster:"
BRIDGE_PREFIX = "rlrunbr"
SUBNETS = ipaddress.ip_network("10.244.0.0/16")


def ip(*args: str, netns_pid: int | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *args]
    if netns_pid is not None:
        argv = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def _links() -> list[dict]:
    return json.loads(ip("-j", "-d", "link", "show").stdout or "[]")


def _used_networks() -> set[ipaddress.IPv4Network]:
    used = set()
    for link in json.loads(ip("-j", "addr", "show").stdout or "[]"):
        for address in link.get("addr_info", []):
            if address.get("family") == "inet":
                used.add(ipaddress.ip_interface(f"{address['local']}/{address['prefixlen']}").network)
    return used


def collect_stale_bridges() -> list[str]:
    """Deletes the bridges whose creating process is gone; returns their names."""
    removed = []
    for link in _links():
        alias = link.get("ifalias", "")
        if link["ifname"].startswith(BRIDGE_PREFIX) and alias.startswith(ALIAS_PREFIX):
            pid = int(alias[len(ALIAS_PREFIX) :])
            if not alive(pid):
                ip("link", "del", link["ifname"], check=False)
                removed.append(link["ifname"])
    return removed


@dataclass
class Bridge:
    name: str
    network: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def prefix(self) -> int:
        return self.network.prefixlen

    @classmethod
    def create(cls) -> Bridge:
        """A new bridge on the first /24 of 10.244.0.0/16 that no interface uses. `ip link add`
        of a taken name fails, which makes the choice safe against a parallel session."""
        collect_stale_bridges()
        used = _used_networks()
        for index, network in enumerate(SUBNETS.subnets(new_prefix=24)):
            if any(network.overlaps(other) for other in used):
                continue
            name = f"{BRIDGE_PREFIX}{index}"
            if ip("link", "add", name, "type", "bridge", check=False).returncode != 0:
                continue
            bridge = cls(name, network)
            try:
                ip("link", "set", name, "alias", f"{ALIAS_PREFIX}{os.getpid()}")
                ip("addr", "add", f"{bridge.gateway}/{bridge.prefix}", "dev", name)
                ip("link", "set", name, "up")
            except BaseException:
                bridge.delete()
                raise
            return bridge
        raise ClusterError(f"no free /24 in {SUBNETS} for the pod network")

    def delete(self) -> None:
        ip("link", "del", self.name, check=False)

    def exists(self) -> bool:
        return ip("link", "show", self.name, check=False).returncode == 0


class Addresses:
    """The pod IPs of a bridge's /24 (.1 is the host's)."""

    def __init__(self, network: ipaddress.IPv4Network):
        self._free = [str(host) for host in list(network.hosts())[1:]]
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            if not self._free:
                raise ClusterError("the pod network has no free address")
            return self._free.pop(0)

    def give_back(self, address: str) -> None:
        with self._lock:
            self._free.append(address)


def veth_name(bridge: Bridge, address: str) -> str:
    """The host end of a pod's veth pair: unique per bridge and pod address (15 bytes at most)."""
    return f"rlv{bridge.name[len(BRIDGE_PREFIX) :]}x{address.rsplit('.', 1)[1]}"


def attach(bridge: Bridge, sandbox_pid: int, address: str) -> str:
    """Joins the network namespace of `sandbox_pid` to the bridge as `eth0` with `address`;
    returns the host end's name."""
    host = veth_name(bridge, address)
    ip("link", "del", host, check=False)  # a pod that used this address before may linger
    ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", str(sandbox_pid))
    ip("link", "set", host, "master", bridge.name, "up")
    ip("link", "set", "lo", "up", netns_pid=sandbox_pid)
    ip("addr", "add", f"{address}/{bridge.prefix}", "dev", "eth0", netns_pid=sandbox_pid)
    ip("link", "set", "eth0", "up", netns_pid=sandbox_pid)
    ip("route", "add", "default", "via", bridge.gateway, netns_pid=sandbox_pid)
    return host


def wait_detached(host: str, timeout_s: float = 10.0) -> None:
    """The kernel removes a veth pair when its namespace goes, a little after the last process
    in it exits; a pair still there after `timeout_s` is deleted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ip("link", "show", host, check=False).returncode != 0:
            return
        time.sleep(0.1)
    ip("link", "del", host, check=False)
