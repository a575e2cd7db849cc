"""Secure by default in the cluster (issue 32 item 6): each run's generated bearer token and API
key, the NetworkPolicy, TLS from a named Secret, and an operator that reads no Secret.

The token gate is checked over real gRPC: a GrpcServer built from the run file the operator
renders, with the token file the pods mount from the run's Secret, serving every rlrun service.
Without the token every RPC but health is refused; with it the call reaches the service."""

from __future__ import annotations

import base64
import copy
import importlib
import tomllib
from pathlib import Path

import grpc
import kubernetes_validate.utils
import pytest
from google.protobuf import message_factory

from rlrun.common.config import resolve_config
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.operator.auth import run_credentials
from rlrun.operator.rbac import REQUIRED_RULES, SECRET_RULES, permission_set
from rlrun.operator.reconcile import AUTH_HASH_ANNOTATION, Defaults, desired_state

from .test_reconcile import K8S_VERSIONS, container, make_run, objects, pod

PROTO_MODULES = (
    "env",
    "inference",
    "orchestrator",
    "trainer",
    "weights",
    "plan",
    "trace",
    "training",
    "sampling",
)
KEY = b"k" * 32


def _services():
    """Every gRPC service of the rlrun.v1 protos: (module, descriptor)."""
    found = []
    for name in PROTO_MODULES:
        module = importlib.import_module(f"rlrun.v1.{name}_pb2")
        found += [(name, service) for service in module.DESCRIPTOR.services_by_name.values()]
    return found


def _mounted(state, component_obj, secret) -> dict[str, str]:
    """The files the pod sees under its auth mount: {path in the pod: content}."""
    (volume,) = [v for v in pod(component_obj)["volumes"] if v["name"] == "auth"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    (mount,) = [m for m in container(component_obj)["volumeMounts"] if m["name"] == "auth"]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return {f"{mount['mountPath']}/{item['path']}": data[item["key"]] for item in volume["secret"]["items"]}


async def _complete(call, streaming: bool) -> None:
    if streaming:
        async for _ in call:
            pass
    else:
        await call


async def test_every_rpc_is_refused_without_the_runs_token(tmp_path: Path):
    state = desired_state(make_run(inference={"httpPort": 8000}), Defaults(token_key=KEY))
    objs = objects(state)
    secret = objs[("Secret", "r-auth")]
    raw = tomllib.loads(objs[("ConfigMap", "r-config")]["data"]["config.toml"])
    files = _mounted(state, objs[("StatefulSet", "r-inference")], secret)
    token_path = raw["grpc"]["auth_token_file"]
    assert raw["inference"]["api_key_file"] in files  # the pod mounts the file its config names
    # What the pod reads at the path its config names, here in a local file.
    local = tmp_path / "token"
    local.write_text(files[token_path])
    raw["grpc"]["auth_token_file"] = str(local)
    config, _ = resolve_config(raw)

    server = GrpcServer(ServerOptions.from_config(config.grpc, "127.0.0.1", 0), [])
    services = _services()
    for module_name, service in services:
        grpc_module = importlib.import_module(f"rlrun.v1.{module_name}_pb2_grpc")
        base = getattr(grpc_module, f"{service.name}Servicer")
        getattr(grpc_module, f"add_{service.name}Servicer_to_server")(base(), server.server)
    await server.start()
    server.set_serving(True)
    try:
        address = f"127.0.0.1:{server.port}"
        checked = 0
        for token, expected in (
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("wrong", grpc.StatusCode.UNAUTHENTICATED),
            (files[token_path], grpc.StatusCode.UNIMPLEMENTED),
        ):
            channel = open_channel(address, ClientOptions(deadline_s=5, retries=1, auth_token=token))
            try:
                for _, service in services:
                    for method in service.methods:
                        request = message_factory.GetMessageClass(method.input_type)()
                        output = message_factory.GetMessageClass(method.output_type)
                        path = f"/{service.full_name}/{method.name}"
                        kind = (
                            ("stream" if method.client_streaming else "unary")
                            + "_"
                            + ("stream" if method.server_streaming else "unary")
                        )
                        call = getattr(channel, kind)(
                            path,
                            request_serializer=type(request).SerializeToString,
                            response_deserializer=output.FromString,
                        )
                        argument = iter([request]) if method.client_streaming else request
                        with pytest.raises(grpc.aio.AioRpcError) as refused:
                            await _complete(call(argument, timeout=5), method.server_streaming)
                        # Without the token the gate refuses; with it the call gets through
                        # to the (unimplemented) servicer.
                        assert refused.value.code() == expected, (path, token)
                        checked += 1
                # Health stays open to probes.
                from grpc_health.v1 import health_pb2, health_pb2_grpc

                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
                assert health.status == health_pb2.HealthCheckResponse.SERVING
            finally:
                await channel.close()
        mutating = {"UpdateWeights", "TrainStep", "Stop", "Pause", "Rollback", "SubmitBatch", "RunGroup"}
        names = {m.name for _, s in services for m in s.methods}
        assert checked == 3 * sum(len(s.methods) for _, s in services)
        assert mutating & names, names  # the RPCs that change a run are among those checked
    finally:
        await server.stop(0)


def test_each_run_gets_its_own_credentials_derived_from_the_operator_key():
    run = make_run(inference={"httpPort": 8000})
    state = desired_state(run, Defaults(token_key=KEY))
    objs = objects(state)
    secret = objs[("Secret", "r-auth")]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    expected = run_credentials(KEY, "ns", "r", run["metadata"]["uid"])
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"token": expected.token, "api-key": expected.api_key}
    # Same key, same run: the same credentials (a restarted operator agrees with the pods).
    assert objects(desired_state(run, Defaults(token_key=KEY)))[("Secret", "r-auth")] == secret
    # Another run of the same name (a new uid), or another key: different ones.
    other = copy.deepcopy(run)
    other["metadata"]["uid"] = "11111111-2222-4333-8444-555555555555"
    assert (
        objects(desired_state(other, Defaults(token_key=KEY)))[("Secret", "r-auth")]["data"] != secret["data"]
    )
    rotated = objects(desired_state(run, Defaults(token_key=b"z" * 32)))
    assert rotated[("Secret", "r-auth")]["data"] != secret["data"]
    # A new key rolls every pod (they read the token when they start).
    for obj in objs.values():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            annotation = obj["spec"]["template"]["metadata"]["annotations"][AUTH_HASH_ANNOTATION]
            assert (
                annotation
                != rotated[(obj["kind"], obj["metadata"]["name"])]["spec"]["template"]["metadata"][
                    "annotations"
                ][AUTH_HASH_ANNOTATION]
            )
            assert expected.token not in str(obj)  # the token itself is in no pod template
    # Only the inference pods see the API key; every pod sees the token.
    for obj in objs.values():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            files = _mounted(state, obj, secret)
            assert files["/etc/rlrun/auth/token"] == expected.token
            assert ("/etc/rlrun/auth/api-key" in files) == obj["metadata"]["name"].endswith("-inference")
    for version in K8S_VERSIONS:
        kubernetes_validate.utils.validate(secret, version, strict=True)


def test_the_operator_may_not_read_secrets():
    # Secrets are granted apart (only in the run namespaces), and never to read.
    assert not [p for p in permission_set(REQUIRED_RULES) if p[1] == "secrets"]
    granted = permission_set(SECRET_RULES)
    assert {(g, r, v) for g, r, v in granted if r == "secrets"} == {
        ("", "secrets", "create"),
        ("", "secrets", "patch"),
        ("", "secrets", "delete"),
    }


def _peers(rule) -> list[str]:
    return sorted(
        peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name", "<own>")
        for peer in rule["from"]
    )


def test_the_network_policy_admits_the_run_the_operator_prometheus_and_named_namespaces():
    run = make_run(
        inference={"httpPort": 8000},
        network={"allowedNamespaces": ["eval", "env-hub"]},
    )
    defaults = Defaults(token_key=KEY, operator_namespace="rlrun-system", metrics_namespaces=("monitoring",))
    objs = objects(desired_state(run, defaults))
    policy = objs[("NetworkPolicy", "r-network")]
    for version in K8S_VERSIONS:
        kubernetes_validate.utils.validate(policy, version, strict=True)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"rlrun.dev/run": "r"}}
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open (Hub, external env-servers)
    own, operator, scrape, named = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"rlrun.dev/run": "r"}}}]}
    # Every pod of the run is selected, and each carries the run label the rules match.
    for obj in objs.values():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            assert obj["spec"]["template"]["metadata"]["labels"]["rlrun.dev/run"] == "r"
    assert _peers(operator) == ["rlrun-system"]
    assert operator["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert operator["ports"] == [{"protocol": "TCP", "port": 50051}]
    assert _peers(scrape) == ["monitoring"] and scrape["ports"] == [{"protocol": "TCP", "port": 9090}]
    assert _peers(named) == ["env-hub", "eval"]
    assert named["ports"] == [{"protocol": "TCP", "port": 50051}, {"protocol": "TCP", "port": 8000}]

    # The spec's metrics namespaces win; none named and no operator namespace: only the run.
    bare = objects(
        desired_state(
            make_run(network={"metricsNamespaces": []}),
            Defaults(token_key=KEY, metrics_namespaces=("monitoring",)),
        )
    )
    assert len(bare[("NetworkPolicy", "r-network")]["spec"]["ingress"]) == 1


def test_tls_comes_from_the_named_secret_for_grpc_and_http():
    run = make_run(inference={"httpPort": 8000}, secrets={"tls": {"secretName": "r-cert"}})
    state = desired_state(run, Defaults(token_key=KEY))
    objs = objects(state)
    for obj in objs.values():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            volumes = {v["name"]: v for v in pod(obj)["volumes"]}
            assert volumes["tls"]["secret"] == {"secretName": "r-cert"}
    raw = tomllib.loads(objs[("ConfigMap", "r-config")]["data"]["config.toml"])
    assert raw["grpc"]["tls"] == {
        "cert": "/etc/rlrun/tls/tls.crt",
        "key": "/etc/rlrun/tls/tls.key",
        "ca": "/etc/rlrun/tls/ca.crt",
    }
    assert (raw["inference"]["http_tls_cert"], raw["inference"]["http_tls_key"]) == (
        "/etc/rlrun/tls/tls.crt",
        "/etc/rlrun/tls/tls.key",
    )


def test_the_status_poll_of_a_tls_run_needs_the_operators_ca(tmp_path):
    from rlrun.operator.status_client import client_options

    with pytest.raises(ValueError, match="--grpc-tls-ca"):
        client_options(3.0, "t", tls=True)
    ca = tmp_path / "ca.crt"
    options = client_options(3.0, "t", tls=True, ca=ca)
    assert options.tls_ca == ca and options.auth_token == "t" and options.tls_cert is None
