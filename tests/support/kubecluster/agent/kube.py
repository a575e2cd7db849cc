"""A small Kubernetes REST client on plain dicts (urllib3, as the official client uses), for the
node agent: it reads and writes JSON objects by path and follows watches, authenticating with
the kubeconfig's client certificate, which is what makes the API server see a node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


class Kube:
    def __init__(self, kubeconfig: Path, timeout_s: float = 30.0):
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
        user = next(u for u in config["users"] if u["name"] == context["user"])["user"]
        self.server = cluster["server"].rstrip("/")
        self.timeout_s = timeout_s
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=16,
            cert_reqs="CERT_REQUIRED",
            ca_certs=cluster["certificate-authority"],
            cert_file=user["client-certificate"],
            key_file=user["client-key"],
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        response = self._pool.request(
            method, url, body=data, headers=headers, timeout=self.timeout_s, retries=False
        )
        text = response.data.decode(errors="replace")
        if response.status >= 400:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)

    def watch(self, path: str, resource_version: str, timeout_s: int = 240, **params: Any) -> Iterator[dict]:
        """The events of a watch from `resource_version`, until the server ends it."""
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        response = self._pool.request(
            "GET",
            f"{self.server}{path}?{urlencode(query)}",
            preload_content=False,
            timeout=urllib3.Timeout(connect=self.timeout_s, read=timeout_s + 30),
            retries=False,
        )
        try:
            if response.status >= 400:
                raise ApiError("WATCH", path, response.status, response.read().decode(errors="replace"))
            buffer = b""
            for chunk in response.stream(64 * 1024, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()
