"""`rlrun operator`: runs the kopf operator that reconciles RLRun resources.

Module-level imports stay light; kopf and the handlers load inside `main`.
"""

from __future__ import annotations

import argparse
import os

from rlrun.common.arguments import port

ENV_IMAGES = {
    "inference": "RLRUN_IMAGE_INFERENCE",
    "env-server": "RLRUN_IMAGE_ENV_SERVER",
    "orchestrator": "RLRUN_IMAGE_ORCHESTRATOR",
    "trainer": "RLRUN_IMAGE_TRAINER",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch RLRuns in this namespace (repeatable)",
    )
    scope.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="watch RLRuns in every namespace (default when no --namespace is given)",
    )
    parser.add_argument(
        "--liveness-port",
        type=port,
        default=8080,
        help="serve kopf's liveness probe on http://0.0.0.0:PORT/healthz; 0 = off (default: 8080)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=9090,
        help="serve the operator's Prometheus metrics on http://0.0.0.0:PORT/metrics; 0 = off (default: 9090)",
    )
    parser.add_argument(
        "--status-interval",
        type=float,
        default=float(os.environ.get("RLRUN_STATUS_INTERVAL", "10")),
        metavar="SECONDS",
        help="how often each run's orchestrator status is polled (default: 10, env RLRUN_STATUS_INTERVAL)",
    )
    parser.add_argument(
        "--cluster-domain",
        default=os.environ.get("RLRUN_CLUSTER_DOMAIN", "cluster.local"),
        help="cluster DNS domain used in service addresses (default: cluster.local, env RLRUN_CLUSTER_DOMAIN)",
    )
    for component, env in ENV_IMAGES.items():
        parser.add_argument(
            f"--{component}-image",
            default=os.environ.get(env),
            metavar="IMAGE",
            help=f"default {component} image for runs that set none (env {env})",
        )
    parser.add_argument(
        "--image-pull-policy",
        default=os.environ.get("RLRUN_IMAGE_PULL_POLICY") or None,
        choices=["Always", "IfNotPresent", "Never"],
        help="default imagePullPolicy of run pods (env RLRUN_IMAGE_PULL_POLICY)",
    )
    parser.add_argument(
        "--token-key-file",
        default=os.environ.get("RLRUN_TOKEN_KEY_FILE") or None,
        metavar="FILE",
        help="key (32+ bytes) every run's gRPC token and API key derive from; the same key gives "
        "a restarted operator the same credentials (default: a random key per process, "
        "env RLRUN_TOKEN_KEY_FILE)",
    )
    parser.add_argument(
        "--grpc-tls-dir",
        default=None,
        metavar="DIR",
        help="for runs with spec.secrets.tls: ca.crt (checks their orchestrator) and optionally "
        "tls.crt/tls.key (the operator's client certificate), as a cert-manager Secret mounts them",
    )
    parser.add_argument(
        "--metrics-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="namespace whose pods may scrape the runs' metrics ports (their NetworkPolicy "
        "admits it; repeatable)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def options_from_args(args: argparse.Namespace):
    import logging
    from pathlib import Path

    from rlrun.operator.auth import new_key, read_key
    from rlrun.operator.handlers import OperatorOptions
    from rlrun.operator.reconcile import Defaults

    images = dict(Defaults().images)
    for component in ENV_IMAGES:
        value = getattr(args, f"{component.replace('-', '_')}_image", None)
        if value:
            images[component] = value
    if args.token_key_file:
        token_key = read_key(args.token_key_file)
    else:
        logging.getLogger("rlrun.operator").warning(
            "no --token-key-file: a random key, so a restart of the operator gives every run new "
            "credentials (and restarts its pods)"
        )
        token_key = new_key()
    defaults = Defaults(
        images=images,
        cluster_domain=args.cluster_domain,
        pull_policy=args.image_pull_policy,
        token_key=token_key,
        operator_namespace=os.environ.get("POD_NAMESPACE") or None,
        metrics_namespaces=tuple(args.metrics_namespace),
    )
    tls: dict[str, Path] = {}
    if args.grpc_tls_dir:
        folder = Path(args.grpc_tls_dir)
        tls["grpc_tls_ca"] = folder / "ca.crt"
        if (folder / "tls.crt").exists() and (folder / "tls.key").exists():
            tls["grpc_tls_cert"], tls["grpc_tls_key"] = folder / "tls.crt", folder / "tls.key"
    return OperatorOptions(defaults=defaults, status_interval_s=args.status_interval, **tls)


def main(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from rlrun.operator.handlers import build_registry, configure_settings

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = options_from_args(args)
    if args.metrics_port:
        from rlrun.common.metrics import start_metrics_server

        start_metrics_server(args.metrics_port, host="0.0.0.0", registry=options.metrics.registry)
    settings = configure_settings(kopf.OperatorSettings(), options)
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    namespaces = list(args.namespace)
    kopf.run(
        registry=build_registry(options),
        settings=settings,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
    )
    return 0
