"""Each run's credentials: a gRPC bearer token and an OpenAI API key, derived, not stored.

Both are HMAC-SHA256 of the run's identity (namespace, name, uid) under the operator's key
(`rlrun operator --token-key-file`, a Secret the chart creates in the operator's namespace and
mounts into its pod). The operator writes them into the run's Secret `<run>-auth`, which the
run's pods mount, and computes the token again whenever it polls the orchestrator. So it never
reads a Secret back: its RBAC holds `create` and `patch` on Secrets (to write that one), no
`get`, `list` or `watch`. A new run of the same name has a new uid, hence new credentials, and
the pods of one run all agree on them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_BYTES = 32


@dataclass(frozen=True)
class RunCredentials:
    token: str
    """The gRPC bearer token (`grpc.auth_token_file`)."""
    api_key: str
    """The OpenAI HTTP endpoint's API key (`inference.api_key_file`)."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def read_key(path: str) -> bytes:
    """The operator's key from a file (as a Secret mounts it); at least 32 bytes."""
    with open(path, "rb") as handle:
        key = handle.read().strip()
    if len(key) < KEY_BYTES:
        raise ValueError(f"{path}: the token key must be at least {KEY_BYTES} bytes, got {len(key)}")
    return key


def run_credentials(key: bytes, namespace: str, name: str, uid: str) -> RunCredentials:
    def derive(purpose: str) -> str:
        message = "\0".join((purpose, namespace, name, uid)).encode()
        return hmac.new(key, message, hashlib.sha256).hexdigest()

    return RunCredentials(token=derive("grpc-token"), api_key=f"sk-{derive('openai-api-key')}")
