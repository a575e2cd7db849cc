"""The agent's kubelet API, read-only: `GET /containerLogs/<namespace>/<pod>/<container>` (with
`previous`, `tailLines`, `limitBytes` and `follow`), which the API server proxies for `kubectl
logs`. HTTPS on the node's address, with a serving certificate from the cluster's CA; clients
must present a certificate from the same CA (the API server's kubelet client certificate), as a
kubelet with anonymous access off requires."""

from __future__ import annotations

import http.server
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

LogLookup = Callable[[str, str, str, bool], tuple[Path, Callable[[], bool]] | None]
"""(namespace, pod, container, previous) -> (the log file, whether its writer is still running)."""


class KubeletServer:
    def __init__(self, host: str, port: int, cert: str, key: str, client_ca: str, lookup: LogLookup):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
        handler = type("Handler", (_Handler,), {"lookup": staticmethod(lookup)})
        self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet api", daemon=True)

    def start(self) -> KubeletServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    lookup: LogLookup
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if url.path == "/healthz":
            self._reply(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._reply(404, b"not found: the test node agent serves /containerLogs only\n")
            return
        namespace, pod, container = parts[1:]
        found = self.lookup(namespace, pod, container, query.get("previous") == "true")
        if found is None:
            self._reply(404, f"no logs of container {container} in pod {namespace}/{pod}\n".encode())
            return
        path, running = found
        data = path.read_bytes() if path.exists() else b""
        if "tailLines" in query:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
        if "limitBytes" in query:
            data = data[: int(query["limitBytes"])]
        if query.get("follow") != "true":
            self._reply(200, data)
            return
        self._follow(path, data, running)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _follow(self, path: Path, head: bytes, running: Callable[[], bool]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        offset = path.stat().st_size if path.exists() else 0
        try:
            self._chunk(head)
            while True:
                alive = running()
                with path.open("rb") as log:
                    log.seek(offset)
                    data = log.read()
                offset += len(data)
                self._chunk(data)
                if not alive:
                    break
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
