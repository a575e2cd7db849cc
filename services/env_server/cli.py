"""`rlrun serve env-server --config C [--env NAME ...]`.

Hosts the `[[orchestrator.train.env]]` and `[[orchestrator.eval.env]]` entries named by `--env`
(their `name`, else their `id`; repeatable), or by default every entry without an `address`. Imports stay light here:
the parser is built for every `rlrun` command.
"""

from __future__ import annotations

import argparse

from rlrun.common.config import EnvConfig, RunConfig

DESCRIPTION = (
    "The environment server: hosts the [[orchestrator.train.env]] and [[orchestrator.eval.env]] "
    "entries named by --env "
    "(default: every entry without an address) and runs their rollouts (EnvService: prompts, "
    "model calls to the inference services a plan names, scoring) for the orchestrator."
)
"""What `rlrun serve ... --help` says the service does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        dest="env_names",
        action="append",
        default=[],
        metavar="NAME",
        help="host the env entry with this name (or id); repeatable. Default: every entry without an address",
    )


def select_entries(config: RunConfig, names: list[str]) -> list[EnvConfig]:
    """The entries to host; ValueError naming an unknown entry or an empty selection."""
    entries = [*config.orchestrator.train.env, *config.orchestrator.eval.env]
    if not names:
        chosen = [e for e in entries if not e.address]
        if not chosen:
            raise ValueError(
                "every orchestrator.train.env and orchestrator.eval.env entry has an address; "
                "name the ones to host with --env"
            )
        return chosen
    by_key = {e.key: e for e in entries}
    unknown = [n for n in names if n not in by_key]
    if unknown:
        raise ValueError(
            f"--env {unknown[0]!r} names no orchestrator.train.env or orchestrator.eval.env entry; "
            f"entries are {sorted(by_key)}"
        )
    return [by_key[n] for n in dict.fromkeys(names)]


def main(config: RunConfig, args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from rlrun.common.grpc_client import ClientOptions
    from rlrun.common.service import ServiceContext, serve_main
    from rlrun.env_server.server.host import EnvHost
    from rlrun.env_server.server.servicer import SERVICE_NAME, EnvServicer
    from rlrun.v1 import env_pb2_grpc

    try:
        entries = select_entries(config, args.env_names)
    except ValueError as error:
        print(f"rlrun: {error}", file=sys.stderr)
        return 2

    async def setup(ctx: ServiceContext):
        options = ClientOptions.from_config(config.grpc)
        hosts = {entry.key: EnvHost(entry, config, ctx.log_dir, options) for entry in entries}

        async def cleanup() -> None:
            await asyncio.gather(*(host.stop() for host in hosts.values()))

        try:
            await asyncio.gather(*(host.start() for host in hosts.values()))
        except BaseException:
            await cleanup()
            raise
        for entry in entries:
            ctx.log.info("hosting env %s (%s), pool %s", entry.key, entry.id, entry.pool.model_dump())
        servicer = EnvServicer(
            hosts, default_timeout_s=config.orchestrator.rollout_timeout_s, limits=config.request_limits()
        )
        env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, ctx.server.server)
        return cleanup

    return serve_main("env-server", config, args, [SERVICE_NAME], setup)
