"""Prometheus metrics: the /metrics HTTP endpoint every service exposes, and metric naming.

Metric names follow `rlrun_<service>_<what>_<unit>` (DESIGN.md section 7): counters end in
`_total`, units are base units (`seconds`, `bytes`, `tokens`, ...), labels are bounded.

    from prometheus_client import Counter
    GENERATED = Counter(metric_name("inference", "generated_tokens", "total"), "Tokens generated.")
    port = start_metrics_server(cfg.metrics_port)
"""

from __future__ import annotations

import logging
import re
import threading

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry

__all__ = ["metric_name", "start_metrics_server", "stop_metrics_server"]

log = logging.getLogger("rlrun.common.metrics")

_PART = re.compile(r"^[a-z][a-z0-9_]*$")
_servers: dict[int, tuple[object, threading.Thread | None]] = {}
_lock = threading.Lock()


def metric_name(service: str, what: str, unit: str) -> str:
    """`rlrun_<service>_<what>_<unit>`; a `-` in the service name becomes `_` (env-server ->
    env_server). Raises ValueError for parts that are not lower-case snake case."""
    service = service.replace("-", "_")
    for label, part in (("service", service), ("what", what), ("unit", unit)):
        if not _PART.match(part):
            raise ValueError(f"metric name {label} {part!r} must be lower-case snake case")
    return f"rlrun_{service}_{what}_{unit}"


def start_metrics_server(port: int, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY) -> int:
    """Serves Prometheus /metrics over HTTP on host:port in a daemon thread; returns the bound
    port (port 0 = OS-assigned)."""
    result = prometheus_client.start_http_server(port, addr=host, registry=registry)
    if isinstance(result, tuple):  # prometheus_client >= 0.20: (server, thread)
        server, thread = result
    else:  # pragma: no cover - older prometheus_client returns None
        if port == 0:
            raise RuntimeError("this prometheus_client cannot report an OS-assigned port; pass a port")
        server, thread = None, None
    bound = int(server.server_port) if server is not None else port
    with _lock:
        _servers[bound] = (server, thread)
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return bound


def stop_metrics_server(port: int) -> None:
    """Stops a server started by `start_metrics_server` (a no-op for unknown ports)."""
    with _lock:
        server, thread = _servers.pop(port, (None, None))
    if server is not None:
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
    if thread is not None:
        thread.join(timeout=5)
