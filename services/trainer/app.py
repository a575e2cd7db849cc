"""`rlrun serve trainer`: builds the learner on every rank, resumes it from the newest complete
checkpoint (unless `--fresh`), then rank 0 serves TrainerService while the other ranks follow
its commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

import grpc

from rlrun.common.config import RunConfig, reload_config
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.logs import setup_logging
from rlrun.common.model import arch_dict
from rlrun.common.service import ServiceContext, limit_threads, log_dir_for, serve_main
from rlrun.trainer.checkpoint import checkpoint_root, latest_checkpoint, load_checkpoint, start_fresh
from rlrun.trainer.coordinator import Coordinator, serve_commands
from rlrun.trainer.distributed import CommandChannel, init_parallelism, shutdown
from rlrun.trainer.learner import build_learner
from rlrun.trainer.replica_watch import ReplicaWatch
from rlrun.trainer.runtime import TrainerRuntime
from rlrun.trainer.servicer import SERVICE_NAME, TrainerServicer
from rlrun.trainer.weight_sync import make_broadcaster
from rlrun.v1 import trainer_pb2_grpc

log = logging.getLogger("rlrun.trainer")


def create_runtime(
    config: RunConfig,
    coordinator: Coordinator,
    client: ClientOptions,
    *,
    resume_state: bytes = b"",
    last_checkpoint: str = "",
) -> TrainerRuntime:
    """The runtime around `coordinator`, broadcasting to `config.inference.addresses`."""
    return TrainerRuntime(
        coordinator,
        make_broadcaster(config, client),
        checkpoint_dir=checkpoint_root(config.run_dir),
        checkpoint=config.trainer.checkpoint,
        arch=arch_dict(config.model),
        world_size=coordinator.learner.parallel.world_size,
        resume_state=resume_state,
        last_checkpoint=last_checkpoint,
    )


def resume_point(config: RunConfig, fresh: bool, remove: bool) -> Path | None:
    """The checkpoint every rank starts from: the newest complete one under the run's
    checkpoint folder (every rank sees the same volume), or none (`--fresh`, or nothing
    saved yet). `remove`: this rank deletes the old checkpoints for `--fresh` (rank 0)."""
    root = checkpoint_root(config.run_dir)
    if fresh:
        if remove and start_fresh(root):
            log.warning("--fresh: removed the checkpoints under %s", root)
        return None
    return latest_checkpoint(root)


def add_trainer_service(server: grpc.aio.Server, runtime: TrainerRuntime, config: RunConfig) -> None:
    servicer = TrainerServicer(
        runtime,
        vocab_size=runtime.coordinator.learner.arch.vocab_size,
        micro_batch_tokens=config.trainer.micro_batch_tokens,
        limits=config.request_limits(),
    )
    trainer_pb2_grpc.add_TrainerServiceServicer_to_server(servicer, server)


def main(config: RunConfig, args: argparse.Namespace) -> int:
    limit_threads(config.trainer.num_threads)
    parallel = init_parallelism(config.trainer)
    try:
        learner = build_learner(config, parallel)
        resume_from = resume_point(config, args.fresh, remove=parallel.rank == 0)
        resume_state = b""
        if resume_from is not None:
            state, resume_state = load_checkpoint(resume_from)
            learner.restore_state(state)
        if parallel.rank != 0:
            log_file = log_dir_for(config, args) / f"trainer-rank{parallel.rank}.log"
            setup_logging("trainer", log_file, config.log_level)
            # torchrun signals every rank at shutdown; these ranks leave when rank 0, having
            # drained its calls, sends Stop (a rank gone early would fail rank 0's last command).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            serve_commands(learner, CommandChannel(parallel))
            return 0
        coordinator = Coordinator(learner, CommandChannel(parallel) if parallel.world_size > 1 else None)

        async def setup(ctx: ServiceContext):
            if resume_from is not None:
                ctx.log.info(
                    "resumed from %s at step %d, version %d", resume_from, learner.step, learner.version
                )
            client = ClientOptions.from_config(config.grpc)
            runtime = create_runtime(
                config, coordinator, client, resume_state=resume_state, last_checkpoint=str(resume_from or "")
            )
            if resume_from is None:
                # Step 0 saved too: a rollback always has a checkpoint to go back to.
                await runtime.save()
            add_trainer_service(ctx.server.server, runtime, config)
            watch = ReplicaWatch(
                runtime,
                client,
                config.trainer.broadcast.resync_interval_s,
                lambda: reload_config(args.config, args.overrides).inference.addresses,
            )
            ctx.background.append(asyncio.create_task(watch.run()))

            async def cleanup() -> None:
                await runtime.save_unsaved()
                await watch.close()
                await runtime.broadcaster.close()
                if coordinator.channel is not None:
                    await asyncio.to_thread(coordinator.stop)

            return cleanup

        return serve_main("trainer", config, args, [SERVICE_NAME], setup, config.trainer.num_threads)
    finally:
        shutdown(parallel)
