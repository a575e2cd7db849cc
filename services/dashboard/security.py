"""Who may read the dashboard: the one place that decides it.

- Bound to a loopback address (the default), it answers requests whose Host header names a
  loopback address: a web page elsewhere cannot reach it by pointing a DNS name at 127.0.0.1
  (DNS rebinding).
- Bound to any other address it needs an API key (`--api-key-file`; in a cluster, the run's:
  the Secret `<run>-auth`, key `api-key`, which the operator also hands inference as
  `inference.api_key_file`). Every request but /health and the login page must then carry
  `Authorization: Bearer <key>`, or the session cookie the login page sets once the key was
  typed in (an HMAC of the key, never the key itself).
- Every answer forbids framing, sniffing and any script or style but the dashboard's own
  (the traces are model output: the page writes them as text, and a stray `<script>` in one
  could not run anyway).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from typing import Any
from urllib.parse import parse_qs

OPEN_PATHS = frozenset({"/health", "/login", "/static/dashboard.css", "/static/favicon.svg"})
"""Answered without the key: the probe of `rlrun local`, and the login page."""
COOKIE = "rlrun_dashboard_session"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


class AccessError(ValueError):
    """A dashboard that would be open to the network without a key."""


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """A dashboard off loopback must have an API key: the run's traces are not for the network."""
    if not is_loopback(host) and not api_key:
        raise AccessError(
            f"--host {host} is not a loopback address: give the run's API key with --api-key-file "
            "(a file holding it; in a cluster the run's Secret <run>-auth, key api-key), or keep the "
            "default 127.0.0.1 and reach it through `ssh -L` or `kubectl port-forward`"
        )


def session_token(api_key: str) -> str:
    return hmac.new(api_key.encode(), b"rlrun-dashboard-session", hashlib.sha256).hexdigest()


def _host_name(host_header: str) -> str:
    """`[::1]:7788` -> `::1`, `localhost:7788` -> `localhost`."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _cookies(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out = {}
    for name, value in headers:
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                out[key] = val
    return out


class Access:
    """ASGI middleware for the rules above; the login form (POST /login) is answered here."""

    def __init__(self, app: Any, *, loopback: bool, api_key: str | None):
        if api_key is not None and not api_key.strip():
            raise AccessError("the API key must not be blank")
        self.app = app
        self.loopback = loopback
        self.api_key = api_key
        self._bearer = f"Bearer {api_key}".encode() if api_key else b""
        self._session = session_token(api_key) if api_key else ""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]

        async def send_secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        host = next((v.decode("latin-1") for k, v in headers if k == b"host"), "")
        if self.loopback and not is_loopback(_host_name(host)):
            await _answer(
                send_secured, 421, {"error": f"this dashboard answers loopback names only, not Host {host!r}"}
            )
            return
        path = scope["path"]
        if self.api_key and scope["method"] == "POST" and path == "/login":
            await self._login(receive, send_secured)
            return
        if self.api_key and path not in OPEN_PATHS and not self._authorized(headers):
            if scope["method"] == "GET" and path == "/":
                await _redirect(send_secured, "/login")
            else:
                await _answer(
                    send_secured, 401, {"error": "missing or invalid API key (Authorization: Bearer <key>)"}
                )
            return
        await self.app(scope, receive, send_secured)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = [v for k, v in headers if k == b"authorization"]
        if len(given) == 1 and hmac.compare_digest(given[0], self._bearer):
            return True
        return hmac.compare_digest(_cookies(headers).get(COOKIE, "").encode(), self._session.encode())

    async def _login(self, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > 4096:
                await _answer(send, 413, {"error": "the login form is larger than 4096 bytes"})
                return
            if not message.get("more_body"):
                break
        key = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0]
        if not hmac.compare_digest(key.encode(), (self.api_key or "").encode()):
            await _redirect(send, "/login?failed=1")
            return
        cookie = f"{COOKIE}={self._session}; HttpOnly; SameSite=Strict; Path=/"
        await _redirect(send, "/", [(b"set-cookie", cookie.encode())])


async def _answer(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _redirect(send: Any, location: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"content-length", b"0"), *(extra or [])],
        }
    )
    await send({"type": "http.response.body", "body": b""})
