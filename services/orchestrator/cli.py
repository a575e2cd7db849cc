"""`rlrun serve orchestrator --config C [--exit-on-finish]`.

The status API serves from the start (phase PENDING while it waits for the other services).
After the run finishes the process keeps serving status until Stop or SIGTERM; with
`--exit-on-finish` it exits as soon as the run ends: 0 on success, 1 on failure.
Module-level imports stay light: `rlrun --help` imports this file.
"""

from __future__ import annotations

import argparse

from rlrun.common.config import RunConfig

DESCRIPTION = (
    "The orchestrator: drives the run (warm start, RL steps, evals, checkpoints) against the "
    "inference, env-server and trainer services of the run file, and serves its status "
    "(OrchestratorService) from the start."
)
"""What `rlrun serve ... --help` says the service does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exit-on-finish",
        action="store_true",
        help="exit when the run ends (0 = succeeded, 1 = failed) instead of serving status until Stop or SIGTERM",
    )


def main(config: RunConfig, args: argparse.Namespace) -> int:
    import asyncio

    from rlrun.common.config import reload_config
    from rlrun.common.service import ServiceContext, serve_main
    from rlrun.common.wire.orchestrator import RunStatus
    from rlrun.orchestrator import metrics
    from rlrun.orchestrator.run import tracking
    from rlrun.orchestrator.run.run import Run
    from rlrun.orchestrator.run.status import SERVICE_NAME, OrchestratorServicer
    from rlrun.v1 import orchestrator_pb2_grpc

    status = RunStatus()
    exit_on_finish = bool(getattr(args, "exit_on_finish", False))

    async def setup(ctx: ServiceContext):
        metrics.init_run(config)
        tracking.start(config)
        run = Run(
            config,
            status,
            # Inference scales under a running orchestrator: the run file's list is followed.
            addresses=lambda: reload_config(args.config, args.overrides).inference.addresses,
        )

        def stop(reason: str) -> None:
            if status.finished:
                ctx.log.info("Stop after the run finished: shutting down (%s)", reason)
                ctx.background.append(asyncio.get_running_loop().create_task(ctx.server.stop()))
            else:
                run.request_stop(reason)

        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(
            OrchestratorServicer(status, stop), ctx.server.server
        )

        async def drive() -> None:
            await run.execute()
            if exit_on_finish or run.stop_reason is not None:
                await ctx.server.stop()

        ctx.background.append(asyncio.create_task(drive(), name="orchestrator-run"))
        return None

    try:
        code = serve_main("orchestrator", config, args, [SERVICE_NAME], setup)
    finally:
        tracking.close()
    if exit_on_finish:
        return 0 if status.phase == "succeeded" else 1
    return code
