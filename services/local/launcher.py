"""`rlrun local CONFIG`: start inference, env-server(s), trainer and orchestrator as separate
`rlrun serve` processes on port 0, wire their addresses through `--set`, follow the run
through the orchestrator's status API, and shut everything down on finish, on Ctrl-C and
when any child dies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlrun.common.config import RunConfig
from rlrun.common.grpc_client import ClientOptions, open_channel, wait_for_health
from rlrun.common.service import serve_command
from rlrun.local.processes import ChildFailed, ProcessGroup, raise_autogroup_priority
from rlrun.local.progress import RunProgress
from rlrun.local.report import final_summary, write_reward_plot
from rlrun.v1 import orchestrator_pb2, orchestrator_pb2_grpc

TRAINER_AUTOGROUP_NICE = -10
"""The trainer's scheduling-group nice value (lowering it below 0 needs CAP_SYS_NICE)."""
TERMINAL = {orchestrator_pb2.RUN_PHASE_SUCCEEDED, orchestrator_pb2.RUN_PHASE_FAILED}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _set(key: str, value) -> list[str]:
    return ["--set", f"{key}={json.dumps(value)}"]


class LocalRun:
    def __init__(self, config: RunConfig, config_path: Path, overrides: list[str]):
        self.config = config
        self.config_path = Path(config_path)
        self.overrides = list(overrides)
        self.run_dir = config.run_dir
        self.log_dir = self.run_dir / "logs"
        self.group = ProcessGroup(_child_env())

    def _serve_argv(self, service: str, extra_sets: list[str], *extra: str) -> list[str]:
        overrides = [arg for override in self.overrides for arg in ("--set", override)]
        return serve_command(service, self.config_path, self.log_dir, *overrides, *extra_sets, *extra)

    def start_services(self) -> str:
        """Starts every service in dependency order; returns the orchestrator's address."""
        cfg = self.config
        policy = self.group.start(
            "inference", self._serve_argv("inference", []), self.log_dir / "inference.log"
        )
        sets = _set("inference.addresses", [policy.address])
        for key, target in cfg.orchestrator.models.items():
            if target.kind == "inference" and not target.addresses:
                model_sets = _set("model.path", target.checkpoint) if target.checkpoint else []
                child = self.group.start(
                    f"inference-{key}",
                    self._serve_argv("inference", model_sets),
                    self.log_dir / f"inference-{key}.log",
                )
                sets += _set(f"orchestrator.models.{key}.addresses", [child.address])
        for i, env in enumerate(cfg.orchestrator.train.env):
            if env.address:
                continue
            child = self.group.start(
                f"env-server-{env.key}",
                self._serve_argv("env-server", [], "--env", env.key),
                self.log_dir / f"env-server-{env.key}.log",
            )
            sets += _set(f"orchestrator.train.env.{i}.address", child.address)
        # The trainer runs in a session, and so a CPU scheduling group (Linux' autogroups), of
        # its own; the services that generate share the launcher's. The kernel then splits the
        # CPU between training and generation first, not between their threads. In one group
        # the inference, env-server and orchestrator threads that generate batch n+1 each took
        # a share from the training of batch n, the critical path of an async step: its
        # run-queue wait was a quarter of the step on an idle 2-core machine. Next to other
        # programs the whole stack got one group's share, about one core, leaving nothing
        # to overlap.
        trainer = self.group.start(
            "trainer", self._serve_argv("trainer", sets), self.log_dir / "trainer.log", own_session=True
        )
        # Fair shares still let the generating threads delay training while both want the
        # CPU; with priority to the trainer's group, generation fills the time training
        # leaves (an async step measured 759 -> 673 ms against 641 ms of training alone).
        # Without the privilege (or autogroups) the run goes on at equal shares.
        raise_autogroup_priority(trainer.process.pid, TRAINER_AUTOGROUP_NICE)
        sets += _set("trainer.address", trainer.address)
        orchestrator = self.group.start(
            "orchestrator", self._serve_argv("orchestrator", sets), self.log_dir / "orchestrator.log"
        )
        return orchestrator.address

    async def follow(self, address: str, progress: RunProgress) -> orchestrator_pb2.GetRunStatusResponse:
        options = ClientOptions.from_config(self.config.grpc)
        await wait_for_health(address, options, timeout_s=120.0)
        async with open_channel(address, options) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            while True:
                self.group.check_alive()
                status = await stub.GetStatus(orchestrator_pb2.GetRunStatusRequest(), timeout=10.0)
                progress.update(status)
                if status.phase in TERMINAL:
                    return status
                await asyncio.sleep(0.25)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt wherever the launcher is, its event
    loop included. asyncio.run's own Ctrl-C handling only cancels its main task, once, and a
    cancellation that an awaited library swallows would leave the run going (seen once in CI,
    under load: the run went on for a minute after Ctrl-C)."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_local(config: RunConfig, config_path: Path, overrides: list[str], progress: bool = True) -> int:
    started = time.monotonic()
    run = LocalRun(config, config_path, overrides)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "resolved_config.json").write_text(config.model_dump_json(indent=2))
    print(
        f"rlrun local: {config.name} -> {run.run_dir} (command: rlrun local {shlex.quote(str(config_path))})",
        file=sys.stderr,
    )

    bar = RunProgress(config, enabled=progress)
    with interrupts_raise():
        try:
            address = run.start_services()
            status = asyncio.run(run.follow(address, bar))
        except ChildFailed as error:
            bar.close()
            print(f"rlrun local: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            bar.close()
            print("rlrun local: interrupted; stopping all services", file=sys.stderr)
            return 130
        finally:
            bar.close()
            run.group.stop()
    wall_s = time.monotonic() - started
    plot = write_reward_plot(run.run_dir)
    if plot is not None:
        print(f"rlrun local: reward curve {plot}", file=sys.stderr)
    if status.phase == orchestrator_pb2.RUN_PHASE_FAILED:
        print(f"rlrun local: the run failed: {status.last_error}", file=sys.stderr)
    summary = final_summary(run.run_dir, status, wall_s)
    (run.run_dir / "local_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)
    return 0 if status.phase == orchestrator_pb2.RUN_PHASE_SUCCEEDED else 1
