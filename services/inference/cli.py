"""`rlrun serve inference`: options and entry point. Imports stay light at module level
(the CLI builds its parser from every service's `add_arguments`)."""

from __future__ import annotations

import argparse

from rlrun.common.arguments import non_negative, port
from rlrun.common.config import RunConfig

DESCRIPTION = (
    "The inference service: generates and scores tokens for the policy (the torch engine, or "
    'vLLM with inference.engine = "vllm" on GPUs) over gRPC (InferenceService), takes weight '
    "updates as an UpdateWeights stream, and with --http-port (or inference.http_port) serves "
    "an OpenAI-compatible HTTP API. Health is SERVING once the model is loaded and, with "
    "--require-version N, once weights of version >= N have arrived."
)
"""What `rlrun serve ... --help` says the service does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http-port",
        type=port,
        default=None,
        help="port of the OpenAI-compatible HTTP API; 0 = OS-assigned (overrides inference.http_port)",
    )
    parser.add_argument(
        "--require-version",
        type=non_negative,
        default=None,
        metavar="N",
        help="keep health NOT_SERVING until a weight update of version >= N arrives",
    )


def main(config: RunConfig, args: argparse.Namespace) -> int:
    from rlrun.common.service import serve_main
    from rlrun.inference.service import setup
    from rlrun.inference.servicer import SERVICE_NAME

    return serve_main(
        "inference", config, args, [SERVICE_NAME], setup, num_threads=config.inference.num_threads
    )
