"""kubelet's probes: startup, readiness and liveness, each one thread per running container, with
the probe's initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold and
failureThreshold (the API server fills in their defaults). gRPC (the standard health service,
plaintext, as kubelet speaks it), httpGet and tcpSocket probes are made from the host to the
pod's IP, as kubelet makes them from the node; exec probes run inside the container's
namespaces."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

STARTUP, READINESS, LIVENESS = "startup", "readiness", "liveness"

Exec = Callable[[list[str], float], int]
"""Runs a command in the container with a timeout; returns its exit status."""


def port_number(port: int | str, container: dict[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for each in container.get("ports") or []:
        if each.get("name") == port:
            return int(each["containerPort"])
    raise ValueError(f"container {container['name']} has no port named {port!r}")


def check(probe: dict[str, Any], pod_ip: str, container: dict[str, Any], run: Exec) -> tuple[bool, str]:
    """One probe: (success, what failed)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "grpc" in probe:
            return _grpc(pod_ip, int(probe["grpc"]["port"]), probe["grpc"].get("service") or "", timeout)
        if "httpGet" in probe:
            return _http(probe["httpGet"], pod_ip, container, timeout)
        if "tcpSocket" in probe:
            action = probe["tcpSocket"]
            port = port_number(action["port"], container)
            socket.create_connection((action.get("host") or pod_ip, port), timeout).close()
            return True, ""
        if "exec" in probe:
            status = run(probe["exec"]["command"], timeout)
            return status == 0, f"command exited with {status}"
    except Exception as error:  # noqa: BLE001 - every failure of a probe is a failed probe
        return False, f"{type(error).__name__}: {error}"
    return False, f"probe has no handler: {sorted(probe)}"


def _grpc(host: str, port: int, service: str, timeout: float) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    serving = response.status == health_pb2.HealthCheckResponse.SERVING
    return (
        serving,
        f"service unhealthy (responded with {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)})",
    )


def _http(action: dict[str, Any], pod_ip: str, container: dict[str, Any], timeout: float) -> tuple[bool, str]:
    host = action.get("host") or pod_ip
    port = port_number(action["port"], container)
    if action.get("scheme", "HTTP") == "HTTPS":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host,
            port,
            timeout=timeout,
            context=ssl._create_unverified_context(),  # kubelet does not verify
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {
        "User-Agent": "kube-probe/1.37",
        **{h["name"]: h["value"] for h in action.get("httpHeaders") or []},
    }
    try:
        connection.request("GET", action.get("path") or "/", headers=headers)
        status = connection.getresponse().status
    finally:
        connection.close()
    return 200 <= status < 400, f"HTTP probe failed with statuscode: {status}"


class Prober:
    """Probes one container until `stop()`. `result` starts as kubelet's does: readiness and
    startup failed (not ready, not started), liveness successful; it turns after
    successThreshold successes or failureThreshold failures in a row. A startup probe stops
    once it succeeds."""

    def __init__(
        self,
        kind: str,
        probe: dict[str, Any],
        target: Callable[[], tuple[bool, str]],
        changed: Callable[[], None],
        name: str,
    ):
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        self.kind = kind
        self.probe = probe
        self.target = target
        self.changed = changed
        self.result = kind == LIVENESS
        self.message = ""
        self._stop_event = threading.Event()
        self._successes = 0
        self._failures = 0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        if self._stop_event.wait(float(self.probe.get("initialDelaySeconds", 0))):
            return
        period = float(self.probe.get("periodSeconds", 10))
        while not self._stop_event.is_set():
            ok, message = self.target()
            if self._stop_event.is_set():
                return
            self._record(ok, message)
            if self.kind == STARTUP and self.result:
                return
            self._stop_event.wait(period)

    def _record(self, ok: bool, message: str) -> None:
        if ok:
            self._successes, self._failures = self._successes + 1, 0
            result = True if self._successes >= int(self.probe.get("successThreshold", 1)) else self.result
        else:
            self._successes, self._failures = 0, self._failures + 1
            self.message = message
            result = False if self._failures >= int(self.probe.get("failureThreshold", 3)) else self.result
        if result != self.result or (self.failed and not ok):
            self.result = result
            self.changed()

    @property
    def failed(self) -> bool:
        """A liveness or startup probe past its failure threshold: the container is killed."""
        threshold = int(self.probe.get("failureThreshold", 3))
        return self.kind in (LIVENESS, STARTUP) and self._failures >= threshold
