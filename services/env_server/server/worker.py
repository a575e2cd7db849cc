"""A pool worker process: builds its own environment and inference client and runs many
rollout jobs concurrently on one asyncio loop.

A worker and its pool talk over a socket pair, with asyncio streams on both ends (no helper
threads, so nothing waits on a thread to be scheduled): each message is a 4-byte length and a
pickle of plain data (bytes and dataclasses, never tensors).
  to the worker:   ("run", job_id, RolloutJob, timeout_s) | ("cancel", job_id)
                   | ("abandon", job_id) | ("stop",)
  from the worker: ("ready",) | ("done", job_id, bytes) | ("failed", job_id, message)
                   | ("dropped", job_id) | ("bye",)
`done` carries a serialized message whose field 1 is `repeated Trace traces`, the layout
RunRolloutResponse and RunGroupResponse share, so the pool parses it as either. `cancel`
(the orchestrator's Cancel) ends a job early with cancelled traces; `abandon` (its caller went
away: a deadline passed, or it cancelled the call) stops it without any, and `dropped` says
the work has stopped. End of stream means the other side is gone: a dead worker is noticed at
once, and a worker whose env-server died exits instead of lingering.

Memory comes back: once a worker has no job left, it hands what its jobs used back to the
kernel (`release_memory`), so a burst of rollouts does not leave its peak behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlrun.common.grpc_client import ClientOptions
from rlrun.common.logs import setup_logging
from rlrun.common.memory import freeze_startup, release_memory
from rlrun.common.tokenizer import load_tokenizer
from rlrun.common.wire.env import encode_traces
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.inference_client import InferenceClient
from rlrun.env_server.server.logs import SplitFileHandler
from rlrun.env_server.server.rollout import RolloutJob, Runtime, run_rollouts

log = logging.getLogger("rlrun.env_server.worker")

_LENGTH = struct.Struct("!I")


def send_message(writer: asyncio.StreamWriter, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(payload)) + payload)


async def read_message(reader: asyncio.StreamReader) -> tuple | None:
    """The next message, or None at the end of the stream (the other side is gone)."""
    try:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        return pickle.loads(await reader.readexactly(length))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its environment; picklable."""

    env_key: str
    env_id: str
    env_args: dict[str, Any]
    tokenizer_path: Path | None
    checkpoint_dir: Path | None
    max_model_len: int
    client_options: ClientOptions = field(default_factory=ClientOptions)
    unavailable_retry_s: float = 120.0
    """How long a Generate keeps trying replicas that are UNAVAILABLE (grpc.unavailable_retry_s)."""
    log_dir: Path | None = None
    log_level: str = "INFO"
    harness: dict[str, Any] | None = None
    """The entry's `harness = {id, args}`; None: the env's own."""
    runtime: dict[str, Any] | None = None
    """The entry's `runtime = {type, ...}`; None: the env's own."""


def worker_main(spec: WorkerSpec, sock: socket.socket) -> None:
    """Process entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the pool stops us
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    setup_logging(f"env-server/{spec.env_key}", None, spec.log_level)
    if spec.log_dir is not None:
        logging.getLogger().addHandler(SplitFileHandler(spec.log_dir, spec.env_key))
    asyncio.run(_serve(spec, sock))


class _Worker:
    def __init__(self, env: Environment, runtime: Runtime, writer: asyncio.StreamWriter):
        self.env = env
        self.runtime = runtime
        self.writer = writer
        self.jobs: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}

    def start(self, job_id: int, job: RolloutJob, timeout_s: float) -> None:
        cancelled = asyncio.Event()
        task = asyncio.ensure_future(self._run(job_id, job, timeout_s, cancelled))
        self.jobs[job_id] = (task, cancelled)

    async def _run(self, job_id: int, job: RolloutJob, timeout_s: float, cancelled: asyncio.Event) -> None:
        try:
            traces = await run_rollouts(self.env, job, self.runtime, timeout_s, cancelled)
            payload = encode_traces(traces).data
            send_message(self.writer, ("done", job_id, payload))
        except asyncio.CancelledError:
            send_message(self.writer, ("dropped", job_id))
        except Exception as error:
            log.exception("job %d of env %s failed", job_id, job.env_key, extra={"split": job.task.split})
            send_message(self.writer, ("failed", job_id, f"{type(error).__name__}: {error}"))
        finally:
            self.jobs.pop(job_id, None)
            if not self.jobs:
                release_memory()

    def cancel(self, job_id: int) -> None:
        if job_id in self.jobs:
            self.jobs[job_id][1].set()

    def abandon(self, job_id: int) -> None:
        """Stops the job at its next await; nobody wants its traces."""
        if job_id in self.jobs:
            self.jobs[job_id][0].cancel()

    async def drain(self) -> None:
        """Cancels every job and waits until each has sent its (cancelled) traces."""
        tasks = []
        for task, cancelled in self.jobs.values():
            cancelled.set()
            tasks.append(task)
        await asyncio.gather(*tasks, return_exceptions=True)


async def _serve(spec: WorkerSpec, sock: socket.socket) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    tokenizer = load_tokenizer(spec.tokenizer_path, spec.checkpoint_dir)
    client = InferenceClient(spec.client_options, spec.unavailable_retry_s)
    worker = _Worker(
        make_env(spec.env_id, spec.env_args, spec.harness, spec.runtime),
        Runtime(
            tokenizer, client, spec.max_model_len, tokenizer_path=spec.tokenizer_path or spec.checkpoint_dir
        ),
        writer,
    )
    freeze_startup()
    send_message(writer, ("ready",))
    try:
        while True:
            message = await read_message(reader)
            if message is None:  # the env-server is gone: nobody wants our results
                break
            if message[0] == "run":
                worker.start(*message[1:])
            elif message[0] == "cancel":
                worker.cancel(message[1])
            elif message[0] == "abandon":
                worker.abandon(message[1])
            elif message[0] == "stop":
                await worker.drain()
                send_message(writer, ("bye",))
                await writer.drain()
                break
            else:
                raise ValueError(f"unknown pool message {message[0]!r}")
    finally:
        await client.close()
        writer.close()
