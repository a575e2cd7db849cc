"""Ports a service binds: why one cannot be bound, said so that a user knows what to do.

A service binds every port it needs before it starts anything else (rlrun.common.service), so a
taken port ends it at once, with one line that names the port and the option or config key
that sets it; `rlrun.checks` asks the same question of the ports a run file sets before any
service starts.
"""

from __future__ import annotations

import socket


class CannotBind(RuntimeError):
    """A port a service needs cannot be bound; the message names it and what sets it."""


def why_unbindable(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound now (e.g. `address already in use`), or None.

    Asked with SO_REUSEADDR, as every server here binds (gRPC, `listen_socket`): a service
    killed by SIGKILL leaves its connections in TIME_WAIT on its port for a minute, which a
    plain bind refuses and the real one does not, so that its restart would be refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            return (error.strerror or str(error)).lower()
    return None


def cannot_bind(what: str, host: str, port: int, source: str, reason: str | None = None) -> CannotBind:
    """The error for `what` (e.g. `the gRPC server`) on host:port, set by `source` (an option
    such as `--port` or a config key such as `inference.http_port`)."""
    reason = reason or why_unbindable(host, port) or "the bind failed"
    advice = (
        f"stop what holds it (`ss -ltnp 'sport = :{port}'` names it) or choose another port with {source}"
        if "in use" in reason
        else f"choose another address or port with {source}"
    )
    return CannotBind(f"cannot bind {what} to {host}:{port} ({source}): {reason}; {advice}")


def listen_socket(host: str, port: int, what: str, source: str) -> socket.socket:
    """A TCP socket bound to host:port (0 = OS-assigned), not yet listening; CannotBind when
    the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise cannot_bind(what, host, port, source, (error.strerror or str(error)).lower()) from None
    return sock
