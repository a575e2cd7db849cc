"""ServerOptions / ClientOptions: validation, config translation, the retry service config."""

from __future__ import annotations

import json

import pytest

from rlrun.common.config.grpc import GrpcConfig, TlsConfig
from rlrun.common.grpc_client import DEFAULT_DEADLINE_S, ClientOptions, channel_options, retry_service_config
from rlrun.common.grpc_server import ServerOptions


def test_server_options_validation(tmp_path):
    with pytest.raises(ValueError):
        ServerOptions(tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValueError):
        ServerOptions(tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem", require_client_cert=True)
    with pytest.raises(ValueError):
        ServerOptions(auth_token="  ")
    assert not ServerOptions().tls


def test_options_from_config(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc123\n")
    cfg = GrpcConfig(
        max_message_mb=8,
        deadline_s=30,
        retries=2,
        shutdown_grace_s=1.5,
        auth_token_file=token,
        tls=TlsConfig(
            cert=tmp_path / "c.pem", key=tmp_path / "k.pem", ca=tmp_path / "ca.pem", server_name="svc"
        ),
    )
    server = ServerOptions.from_config(cfg, "127.0.0.1", 0)
    assert server.max_message_bytes == 8 * 2**20
    assert server.shutdown_grace_s == 1.5 and server.auth_token == "abc123" and server.tls
    client = ClientOptions.from_config(cfg)
    assert client.deadline_s == 30 and client.retries == 2 and client.auth_token == "abc123"
    assert client.tls and client.server_name == "svc"
    assert ("grpc.ssl_target_name_override", "svc") in channel_options(client)

    plain = ClientOptions.from_config(GrpcConfig())
    assert plain.auth_token is None and not plain.tls and plain.deadline_s == DEFAULT_DEADLINE_S


def test_empty_token_file_is_an_error(tmp_path):
    token = tmp_path / "token"
    token.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        ServerOptions.from_config(GrpcConfig(auth_token_file=token), "127.0.0.1", 0)


def test_retry_service_config():
    policy = retry_service_config(4)["methodConfig"][0]["retryPolicy"]
    assert policy["maxAttempts"] == 4 and policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert "retryPolicy" not in retry_service_config(1)["methodConfig"][0]
    assert retry_service_config(9)["methodConfig"][0]["retryPolicy"]["maxAttempts"] == 5
    opts = dict(channel_options(ClientOptions(retries=3)))
    assert json.loads(opts["grpc.service_config"]) == retry_service_config(3)
