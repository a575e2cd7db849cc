"""`rlrun local CONFIG`: start inference, env-server(s), trainer and orchestrator as separate
`rlrun serve` processes on port 0, wire their addresses through `--set`, follow the run
through the orchestrator's status API, and shut everything down on finish.

It supervises the services the way Kubernetes does: a service that dies is started again on
the port it had (with backoff, up to `--max-restarts` times), and the services' own recovery
(the trainer's checkpoints, the orchestrator's resume, the replicas' re-sync) carries the run
on. Ctrl-C (or SIGTERM) asks the orchestrator to stop after the current step with a
checkpoint; a second one stops everything at once. The same command again resumes.

No other process can drive the run: unless the run file names a token of its own
(`grpc.auth_token_file`), each `rlrun local` writes a fresh bearer token into the run folder
(`auth-token`, readable by its user alone) and hands it to every service, as Jupyter does on
localhost; every gRPC call and every call to the OpenAI HTTP API must carry it, except health
probes and metrics scrapes. A run with an external env-server (an env with `address`) gets
none, since that server could not know it: the launcher says so, and how to set one.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from rlrun.common.config import RunConfig
from rlrun.common.grpc_client import ClientOptions, open_channel, wait_for_health
from rlrun.common.run_folder import RESOLVED_CONFIG, append_event
from rlrun.common.service import serve_command
from rlrun.common.wire import orchestrator as wire
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.dashboard import registry
from rlrun.dashboard.runs import run_id
from rlrun.local.processes import (
    Child,
    ChildFailed,
    ProcessGroup,
    describe_exit,
    raise_autogroup_priority,
    with_port,
)
from rlrun.local.progress import RunProgress
from rlrun.local.report import final_summary, read_metrics, write_reward_plot
from rlrun.v1 import orchestrator_pb2_grpc

TRAINER_AUTOGROUP_NICE = -10
"""The trainer's scheduling-group nice value (lowering it below 0 needs CAP_SYS_NICE)."""
RESTART_BACKOFF_S = 1.0
"""Wait before a service's first restart; it doubles with each further one (at most 30 s)."""
TARGETS_FILE = "prometheus_targets.json"
RUN_MARKER = RESOLVED_CONFIG
"""Written into every run folder: `--fresh` only deletes a folder that has it."""
STOP_GRACE_S = 600.0
"""How long Ctrl-C waits for the current step and its checkpoint before stopping at once."""
TOKEN_FILE = "auth-token"
"""The run's bearer token in its run folder (when the run file names none)."""


def child_env() -> dict[str, str]:
    """The environment of every service the launcher starts: one thread each, unbuffered."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def set_option(key: str, value) -> list[str]:
    """`--set key=<value as JSON>` (JSON is valid TOML for strings, numbers and lists)."""
    return ["--set", f"{key}={json.dumps(value)}"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _component(name: str) -> str:
    """`inference-reference` -> inference, `env-server-reverse-text` -> env-server."""
    return next(c for c in ("env-server", "inference", "trainer", "orchestrator") if name.startswith(c))


def newest_checkpoint_step(run_dir: Path) -> int | None:
    steps = [
        int(path.name.removeprefix("step_"))
        for path in (run_dir / "checkpoints").glob("step_*")
        if path.name.removeprefix("step_").isdigit()
    ]
    return max(steps, default=None)


def resume_message(run_dir: Path) -> str | None:
    """What resuming `run_dir` continues from, or None when it has no checkpoint."""
    trainer_step = newest_checkpoint_step(run_dir)
    if trainer_step is None:
        return None
    rl = [
        r["step"]
        for r in read_metrics(run_dir)
        if r.get("phase") == "rl" and r["trainer_step"] <= trainer_step
    ]
    at = f"step {max(rl)}" if rl else "the warm start"
    return f"resuming {run_dir} from {at} (trainer step {trainer_step}; use --fresh to start over)"


def clear_run_dir(run_dir: Path) -> None:
    """`--fresh`: deletes an earlier run's folder, and only one (it holds RUN_MARKER)."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    if not (run_dir / RUN_MARKER).exists():
        raise SystemExit(
            f"rlrun local: --fresh would delete {run_dir}, which holds no {RUN_MARKER}: it does not "
            "look like an rlrun output folder; choose another --output-dir"
        )
    shutil.rmtree(run_dir)
    print(f"rlrun local: --fresh: deleted the earlier run in {run_dir}", file=sys.stderr)


def write_run_token(run_dir: Path) -> Path:
    """A fresh bearer token for this `rlrun local`, in a file only its user may read."""
    path = run_dir / TOKEN_FILE
    path.unlink(missing_ok=True)  # a file that exists keeps its mode through O_CREAT
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    return path


def secure_run(config: RunConfig, overrides: list[str]) -> tuple[RunConfig, list[str]]:
    """The run file and overrides with the run's token (`write_run_token`), unless it names
    one or has an external env-server; says which, and how to use it."""
    orch = config.orchestrator
    if config.grpc.auth_token_file is not None:
        token = config.grpc.auth_token_file
    elif external := [env.key for env in (*orch.train.env, *orch.eval.env) if env.address]:
        print(
            f"rlrun local: the run's services ask for no token: its external env-server(s) "
            f"({', '.join(external)}) could not know a generated one; set grpc.auth_token_file "
            "and give the external server the same token to close them",
            file=sys.stderr,
        )
        return config, overrides
    else:
        token = write_run_token(config.run_dir)
        grpc = config.grpc.model_copy(update={"auth_token_file": token})
        config = config.model_copy(update={"grpc": grpc})
        overrides = [*overrides, f"grpc.auth_token_file={json.dumps(str(token))}"]
    print(
        f"rlrun local: every service asks for the run's token ({token}): gRPC metadata "
        "'authorization: Bearer <token>' (grpc.auth_token_file; rlrun dashboard "
        "--orchestrator-token-file), HTTP 'Authorization: Bearer <token>' (the OpenAI API key)",
        file=sys.stderr,
    )
    return config, overrides


class LocalRun:
    def __init__(self, config: RunConfig, config_path: Path, overrides: list[str], max_restarts: int = 5):
        self.config = config
        self.config_path = Path(config_path)
        self.overrides = list(overrides)
        self.max_restarts = max_restarts
        self.run_dir = config.run_dir
        self.log_dir = self.run_dir / "logs"
        self.group = ProcessGroup(child_env())
        self.metrics_ports: dict[str, int] = {}
        self.trainer_address = ""
        self.stopping = False

    def _start(
        self, name: str, service: str, extra_sets: list[str], *extra: str, own_session: bool = False
    ) -> Child:
        overrides = [arg for override in self.overrides for arg in ("--set", override)]
        port = self.metrics_ports[name] = _free_port()
        argv = serve_command(
            service,
            self.config_path,
            self.log_dir,
            *overrides,
            *extra_sets,
            *extra,
            "--metrics-port",
            str(port),
        )
        return self.group.start(name, argv, self.log_dir / f"{name}.log", own_session=own_session)

    def start_services(self) -> str:
        """Starts every service in dependency order; returns the orchestrator's address."""
        cfg = self.config
        http = self._policy_http_port()
        policy = self._start("inference", "inference", [], *(["--http-port", str(http)] if http else []))
        sets = set_option("inference.addresses", [policy.address])
        if http:
            url = f"http://127.0.0.1:{http}"
            sets += set_option("inference.http_addresses", [url])
            self._announce_openai(url)
        for key, target in cfg.orchestrator.models.items():
            if target.kind == "inference" and not target.addresses:
                model_sets = set_option("model.path", target.checkpoint) if target.checkpoint else []
                child = self._start(f"inference-{key}", "inference", model_sets)
                sets += set_option(f"orchestrator.models.{key}.addresses", [child.address])
        entries = [("train", i, env) for i, env in enumerate(cfg.orchestrator.train.env)]
        entries += [("eval", i, env) for i, env in enumerate(cfg.orchestrator.eval.env)]
        for table, i, env in entries:
            if env.address:
                continue
            child = self._start(f"env-server-{env.key}", "env-server", [], "--env", env.key)
            sets += set_option(f"orchestrator.{table}.env.{i}.address", child.address)
        # The trainer runs in a session, and so a CPU scheduling group (Linux' autogroups), of
        # its own; the services that generate share the launcher's. The kernel then splits the
        # CPU between training and generation first, not between their threads. In one group
        # the inference, env-server and orchestrator threads that generate batch n+1 each took
        # a share from the training of batch n, the critical path of an async step: its
        # run-queue wait was a quarter of the step on an idle 2-core machine. Next to other
        # programs the whole stack got one group's share, about one core, leaving nothing
        # to overlap.
        trainer = self._start("trainer", "trainer", sets, own_session=True)
        self._prioritise(trainer)
        self.trainer_address = trainer.address
        sets += set_option("trainer.address", trainer.address)
        orchestrator = self._start("orchestrator", "orchestrator", sets)
        self._write_targets()
        return orchestrator.address

    def _policy_http_port(self) -> int | None:
        """The policy replica's HTTP port when an env generates over HTTP (a verifiers env,
        `vf:<name>`, whose train client calls /inference/v1/generate) and no address is given:
        `inference.http_port`, or a free one; None otherwise."""
        cfg = self.config
        envs = [*cfg.orchestrator.train.env, *cfg.orchestrator.eval.env]
        if cfg.inference.http_addresses or not any(
            env.id.startswith("vf:") and not env.address for env in envs
        ):
            return None
        return cfg.inference.http_port or _free_port()

    def _announce_openai(self, url: str) -> None:
        token = self.config.grpc.auth_token_file
        how = (
            f"; its API key is the run's token: OPENAI_API_KEY=$(cat {token}) rlrun eval "
            f"{shlex.quote(str(self.config_path))} --endpoint {url}/v1 --api-key-env OPENAI_API_KEY"
            if token is not None
            else ""
        )
        print(f"rlrun local: OpenAI-compatible API {url}/v1{how}", file=sys.stderr)

    @staticmethod
    def _prioritise(trainer: Child) -> None:
        # Fair shares still let the generating threads delay training while both want the
        # CPU; with priority to the trainer's group, generation fills the time training
        # leaves (an async step measured 759 -> 673 ms against 641 ms of training alone).
        # Without the privilege (or autogroups) the run goes on at equal shares.
        assert trainer.process is not None
        raise_autogroup_priority(trainer.process.pid, TRAINER_AUTOGROUP_NICE)

    def _write_targets(self) -> Path:
        """A Prometheus file_sd file naming every service's /metrics, printed once."""
        targets = [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {
                    "service": name,
                    "component": _component(name),
                    "run": self.config.name,
                    "namespace": "local",
                },
            }
            for name, port in self.metrics_ports.items()
        ]
        path = self.run_dir / TARGETS_FILE
        path.write_text(json.dumps(targets, indent=2))
        listing = ", ".join(
            f"{name} http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()
        )
        print(f"rlrun local: metrics: {listing} (Prometheus file_sd: {path})", file=sys.stderr)
        return path

    def revive(self, child: Child) -> None:
        """Starts a service that died again, on its port, after a backoff; ChildFailed once it
        has been restarted `max_restarts` times, or when it does not come back."""
        assert child.process is not None
        how = f"{child.name} (pid {child.process.pid}) {describe_exit(child.process.returncode)}"
        attempt = child.restarts + 1
        if attempt > self.max_restarts:
            raise child.failure(
                f"{describe_exit(child.process.returncode)}, and was restarted {child.restarts} times already"
            )
        delay = min(30.0, RESTART_BACKOFF_S * 2 ** (attempt - 1))
        print(
            f"rlrun local: {how}; restarting it ({attempt} of {self.max_restarts}) in {delay:.0f}s; "
            f"its log: {child.log_file}",
            file=sys.stderr,
        )
        rl_steps = [r["step"] for r in read_metrics(self.run_dir) if r.get("phase") == "rl"]
        append_event(
            self.run_dir,
            "restart",
            service=child.name,
            exit=describe_exit(child.process.returncode),
            attempt=attempt,
            step=max(rl_steps, default=0),
        )
        time.sleep(delay)
        argv = with_port(child.argv, child.address.rsplit(":", 1)[1])
        if (
            _component(child.name) == "inference"
            and self.trainer_address
            and "trainer.address" not in " ".join(argv)
        ):
            # A restarted replica asks the trainer for the live version and stays unready
            # until it holds it (its first start came before the trainer's).
            argv += set_option("trainer.address", self.trainer_address)
        self.group.restart(child, argv)
        if child.name == "trainer":
            self._prioritise(child)
        print(f"rlrun local: {child.name} is back (pid {child.process.pid})", file=sys.stderr)

    async def follow(self, address: str, progress: RunProgress) -> RunStatus | None:
        """Polls the run to its end, restarting services that die on the way (None: the run
        was stopped and its orchestrator exited before its last status was seen)."""
        options = ClientOptions.from_config(self.config.grpc)
        await wait_for_health(address, options, timeout_s=120.0)
        async with open_channel(address, options) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            status = None
            while True:
                for child in self.group.exited():
                    assert child.process is not None
                    if self.stopping and child.name == "orchestrator" and child.process.returncode == 0:
                        return status  # a stopped run's orchestrator exits once it has saved
                    # In this thread: the kernel stops a child when the thread that started
                    # it exits (PR_SET_PDEATHSIG), and a worker thread does not live long.
                    self.revive(child)
                    if self.stopping and child.name == "orchestrator":
                        await stub.Stop(wire.stop_request_to_proto("interrupted"), timeout=30.0)
                try:
                    status = wire.status_from_proto(await stub.GetStatus(wire.status_request(), timeout=10.0))
                except grpc.aio.AioRpcError:  # the orchestrator is restarting
                    await asyncio.sleep(0.5)
                    continue
                progress.update(status)
                if status.finished:
                    return status
                await asyncio.sleep(0.25)

    async def stop_after_step(self, address: str, progress: RunProgress) -> RunStatus:
        """Ctrl-C: the orchestrator ends the current step, saves a checkpoint and stops."""
        self.stopping = True
        options = ClientOptions.from_config(self.config.grpc)
        async with open_channel(address, options) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            await stub.Stop(wire.stop_request_to_proto("interrupted"), timeout=30.0)
        await asyncio.wait_for(self.follow(address, progress), STOP_GRACE_S)


def announce_dashboard(run_dir: Path) -> None:
    """Registers the run with the user's dashboard, started in the background when none
    answers, and prints its address; a dashboard that cannot start never stops the run."""
    if importlib.util.find_spec("fastapi") is None:
        print(
            "rlrun local: no dashboard (it needs the serve extra: pip install 'rlrun[serve]')",
            file=sys.stderr,
        )
        return
    try:
        url = registry.ensure(run_dir)
    except (registry.DashboardUnavailable, OSError) as error:
        print(f"rlrun local: no dashboard: {error}", file=sys.stderr)
        return
    print(f"rlrun local: dashboard {url}/#run={run_id(run_dir)}", file=sys.stderr)


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


def _stop_gracefully(run: LocalRun, address: str, bar: RunProgress) -> int:
    """After the first Ctrl-C: 130 once the run stopped with a checkpoint (or was stopped at
    once by a second Ctrl-C)."""
    print(
        "rlrun local: stopping after the current step, with a checkpoint (Ctrl-C again to stop at once)",
        file=sys.stderr,
    )
    try:
        asyncio.run(run.stop_after_step(address, bar))
    except KeyboardInterrupt:
        print("rlrun local: stopping all services now", file=sys.stderr)
        return 130
    except (grpc.aio.AioRpcError, TimeoutError, ChildFailed) as error:
        print(f"rlrun local: could not stop after the step ({error}); stopping all services", file=sys.stderr)
        return 130
    step = newest_checkpoint_step(run.run_dir)
    print(
        f"rlrun local: stopped; checkpoint {run.run_dir / 'checkpoints' / f'step_{step}'}. "
        "Run the same command again to resume.",
        file=sys.stderr,
    )
    return 130


def run_local(
    config: RunConfig,
    config_path: Path,
    overrides: list[str],
    progress: bool = True,
    fresh: bool = False,
    max_restarts: int = 5,
    dashboard: bool = True,
) -> int:
    started = time.monotonic()
    if fresh:
        clear_run_dir(config.run_dir)
    resuming = resume_message(config.run_dir)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"rlrun local: {config.name} -> {config.run_dir} (command: rlrun local {shlex.quote(str(config_path))})",
        file=sys.stderr,
    )
    config, overrides = secure_run(config, overrides)
    run = LocalRun(config, config_path, overrides, max_restarts)
    (run.run_dir / RUN_MARKER).write_text(config.model_dump_json(indent=2))
    if resuming:
        print(f"rlrun local: {resuming}", file=sys.stderr)
    if dashboard:
        announce_dashboard(run.run_dir)

    bar = RunProgress(config, enabled=progress, log=run.log_dir / "orchestrator.log")
    address = ""
    with interrupts_raise():
        try:
            address = run.start_services()
            status = asyncio.run(run.follow(address, bar))
        except ChildFailed as error:
            bar.close()
            print(f"rlrun local: {error}", file=sys.stderr)
            return 1
        except TimeoutError as error:  # the orchestrator never became healthy
            bar.close()
            print(f"rlrun local: {error}; its log: {run.log_dir / 'orchestrator.log'}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            bar.close()
            if not address:
                print("rlrun local: interrupted while starting; stopping all services", file=sys.stderr)
                return 130
            return _stop_gracefully(run, address, bar)
        finally:
            bar.close()
            run.group.stop()
    wall_s = time.monotonic() - started
    plot = write_reward_plot(run.run_dir)
    if plot is not None:
        print(f"rlrun local: reward curve {plot}", file=sys.stderr)
    if status.phase == "failed":
        print(f"rlrun local: the run failed: {status.last_error}", file=sys.stderr)
    summary = final_summary(run.run_dir, status, wall_s)
    (run.run_dir / "local_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)
    return 0 if status.phase == "succeeded" else 1
