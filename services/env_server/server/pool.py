"""Worker pools: the processes that run an environment's rollouts.

Capacity is counted in rollouts: a worker runs up to `multiplex` rollouts at once (a group
of n counts n; a group larger than `multiplex` runs alone on an idle worker). Work that finds
no room waits in the pool.
- static: `num_workers` processes, replaced if one dies.
- elastic: starts with `num_workers`; adds a process (one at a time, up to `max_workers`)
  when the rollouts in flight or waiting reach 90% of the ready capacity, and retires a
  process that has been idle for `idle_shrink_s` while more than `num_workers` are up.

Workers are `spawn`ed processes; each talks to the pool over its own socket pair, read by an
asyncio task (see rlrun.env_server.server.worker). The end of that stream is how the pool learns a
worker is gone, and the end of the pool's side is how a worker learns the env-server is: no
queue can be left with undrained items, so nothing hangs at exit.

A job whose caller goes away (its deadline passed, or it cancelled the call) is abandoned: its
worker stops it without writing traces. Its rollouts keep their place in the worker's capacity
until the worker says it stopped; a worker that has not within ABANDON_GRACE_S (an env stuck
in code that never awaits) is killed and replaced, so that no call's work outlives it by more.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from rlrun.common.config.env import PoolConfig
from rlrun.env_server.server.metrics import WORKER_ROLLOUTS, WORKERS
from rlrun.env_server.server.rollout import RolloutJob
from rlrun.env_server.server.worker import WorkerSpec, read_message, send_message, worker_main

log = logging.getLogger("rlrun.env_server.pool")

GROWTH_THRESHOLD = 0.9
STOP_GRACE_S = 10.0
ABANDON_GRACE_S = 10.0
"""How long a worker may take to stop an abandoned job before it is killed."""


class WorkerLost(Exception):
    """The worker process running the job exited before answering."""


class JobFailed(Exception):
    """The worker hit a bug of its own while running the job (not a rollout error)."""


class JobCancelled(Exception):
    """The job was cancelled before any worker took it."""


@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    writer: asyncio.StreamWriter | None = None
    pending: list[tuple] = field(default_factory=list)
    """Messages sent before the connection was open."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    retiring: bool = False
    jobs: dict[int, int] = field(default_factory=dict)
    """job id -> rollouts"""
    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)

    def send(self, message: tuple) -> None:
        if self.gone.is_set():
            return
        if self.writer is None:
            self.pending.append(message)
        else:
            send_message(self.writer, message)


class WorkerPool:
    def __init__(self, spec: WorkerSpec, config: PoolConfig, reap: Callable[[int], None] | None = None):
        """`reap(pid)`: removes what a worker that died left behind (its sandboxes)."""
        self.spec = spec
        self.config = config
        self.reap = reap
        self.workers: list[_Worker] = []
        self._context = multiprocessing.get_context("spawn")
        self._futures: dict[int, asyncio.Future] = {}
        self._changed = asyncio.Event()
        self._waiting = 0
        self._next_index = 0
        self._stopping = False
        self._maintainer: asyncio.Task | None = None
        self._listeners: set[asyncio.Task] = set()

    # -- state --------------------------------------------------------------------------------

    @property
    def live(self) -> list[_Worker]:
        """Workers that take (or will take, once ready) new work."""
        return [w for w in self.workers if not w.retiring and not w.gone.is_set()]

    @property
    def size(self) -> int:
        return len(self.live)

    @property
    def capacity(self) -> int:
        return sum(self.config.multiplex for w in self.live if w.ready.is_set())

    @property
    def in_flight(self) -> int:
        return sum(w.in_flight for w in self.workers)

    @property
    def elastic(self) -> bool:
        return self.config.type == "elastic"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, timeout_s: float = 120.0) -> None:
        """Starts `num_workers` workers and waits until each has built its environment."""
        started = [self._spawn() for _ in range(self.config.num_workers)]
        for worker in started:
            ready = asyncio.ensure_future(worker.ready.wait())
            gone = asyncio.ensure_future(worker.gone.wait())
            done, _ = await asyncio.wait(
                {ready, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            ready.cancel()
            gone.cancel()
            if not worker.ready.is_set():
                await self.stop()
                raise RuntimeError(
                    f"env {self.spec.env_key}: worker {worker.index} "
                    f"{'exited with code ' + str(worker.process.exitcode) if worker.gone.is_set() else 'did not start'} "
                    f"(see the env-server's stderr)"
                )
        if self.elastic:
            self._maintainer = asyncio.ensure_future(self._shrink_when_idle())

    async def stop(self) -> None:
        """Stops every worker: running jobs come back cancelled; stragglers are killed."""
        self._stopping = True
        if self._maintainer is not None:
            self._maintainer.cancel()
        for worker in self.workers:
            worker.retiring = True
            worker.send(("stop",))
        listeners = list(self._listeners)
        if listeners:
            _, late = await asyncio.wait(listeners, timeout=STOP_GRACE_S)
            for worker in self.workers:
                log.warning("env %s: worker %d did not stop; killing it", self.spec.env_key, worker.index)
                worker.process.kill()
            await asyncio.gather(*late, return_exceptions=True)
        self._changed.set()

    def _spawn(self) -> _Worker:
        ours, theirs = socket.socketpair()
        index, self._next_index = self._next_index, self._next_index + 1
        process = self._context.Process(
            target=worker_main,
            args=(self.spec, theirs),
            name=f"rlrun-env-{self.spec.env_key}-{index}",
            daemon=True,
        )
        process.start()
        theirs.close()  # only the worker may hold its end, or its death would go unnoticed
        worker = _Worker(index, process)
        self.workers.append(worker)
        self._listeners.add(asyncio.ensure_future(self._listen(worker, ours)))
        WORKERS.labels(self.spec.env_key).set(self.size)
        log.info(
            "env %s: started worker %d (pid %d); %d workers", self.spec.env_key, index, process.pid, self.size
        )
        return worker

    async def _listen(self, worker: _Worker, sock: socket.socket) -> None:
        """Reads the worker's messages until its stream ends, then reaps it."""
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        worker.writer = writer
        for message in worker.pending:
            send_message(writer, message)
        worker.pending.clear()
        said_bye = False
        try:
            while (message := await read_message(reader)) is not None:
                if message[0] == "bye":
                    said_bye = True
                else:
                    self._on_message(worker, message)
        finally:
            writer.close()
            await self._reap(worker.process)
            self._remove(worker, lost=not said_bye)
            self._listeners.discard(asyncio.current_task())

    async def _reap(self, process: BaseProcess) -> None:
        """Waits (without a thread) for the process to exit; kills it after STOP_GRACE_S."""
        if process.exitcode is None:
            loop = asyncio.get_running_loop()
            exited = loop.create_future()
            loop.add_reader(process.sentinel, lambda: exited.done() or exited.set_result(None))
            try:
                await asyncio.wait_for(exited, STOP_GRACE_S)
            except TimeoutError:
                log.warning("env %s: %s did not exit; killing it", self.spec.env_key, process.name)
                process.kill()
            finally:
                loop.remove_reader(process.sentinel)
        process.join()

    def _on_message(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready.set()
            worker.idle_since = time.monotonic()
            self._changed.set()
        elif kind == "dropped":
            self._release(worker, message[1])
            abandoned = self._futures.pop(message[1], None)
            if abandoned is not None:
                abandoned.cancel()
        elif kind in ("done", "failed"):
            job_id = message[1]
            self._release(worker, job_id)
            future = self._futures.pop(job_id, None)
            if future is not None and not future.done():
                if kind == "done":
                    future.set_result(message[2])
                else:
                    future.set_exception(JobFailed(message[2]))
        else:
            raise ValueError(f"unknown worker message {kind!r}")

    def _release(self, worker: _Worker, job_id: int) -> None:
        weight = worker.jobs.pop(job_id, 0)
        worker.in_flight -= weight
        WORKER_ROLLOUTS.labels(self.spec.env_key).dec(weight)
        if worker.in_flight == 0:
            worker.idle_since = time.monotonic()
        self._changed.set()

    def _remove(self, worker: _Worker, lost: bool) -> None:
        if lost and not worker.retiring:
            log.error(
                "env %s: worker %d (pid %d) died with exit code %s",
                self.spec.env_key,
                worker.index,
                worker.process.pid,
                worker.process.exitcode,
            )
        if lost and self.reap is not None and worker.process.pid is not None:
            self.reap(worker.process.pid)
        for job_id in list(worker.jobs):
            self._release(worker, job_id)
            future = self._futures.pop(job_id, None)
            if future is not None and not future.done():
                future.set_exception(
                    WorkerLost(
                        f"env {self.spec.env_key}: worker {worker.index} exited "
                        f"(code {worker.process.exitcode}) while running the job"
                    )
                )
        self.workers.remove(worker)
        worker.gone.set()
        WORKERS.labels(self.spec.env_key).set(self.size)
        if not self._stopping and worker.ready.is_set():
            # Replace a worker that died in service; one that died while starting would only
            # die again (its environment cannot be built), so it is not retried.
            while self.size < self.config.num_workers:
                self._spawn()
        self._changed.set()

    # -- scheduling ---------------------------------------------------------------------------

    def _pick(self, weight: int) -> _Worker | None:
        fits = [
            w
            for w in self.live
            if w.ready.is_set() and (w.in_flight + weight <= self.config.multiplex or w.in_flight == 0)
        ]
        return min(fits, key=lambda w: w.in_flight) if fits else None

    def _maybe_grow(self) -> None:
        if not self.elastic or self._stopping or self.size >= self.config.max_workers:
            return
        if any(not w.ready.is_set() for w in self.live):
            return  # one start at a time; its capacity counts once it is ready
        if self.in_flight + self._waiting >= GROWTH_THRESHOLD * self.capacity:
            self._spawn()

    async def _acquire(self, weight: int, cancelled: asyncio.Event) -> _Worker:
        self._waiting += weight
        try:
            while True:
                if cancelled.is_set():
                    raise JobCancelled()
                if self._stopping:
                    raise WorkerLost(f"env {self.spec.env_key}: the pool is stopping")
                if not self.live:
                    raise WorkerLost(
                        f"env {self.spec.env_key}: no worker is running (see the env-server's stderr)"
                    )
                worker = self._pick(weight)
                if worker is not None:
                    return worker
                self._maybe_grow()
                self._changed.clear()
                waits = {asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(cancelled.wait())}
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            self._waiting -= weight

    async def run(self, job_id: int, job: RolloutJob, timeout_s: float, cancelled: asyncio.Event) -> bytes:
        """Runs the job on a worker; returns its serialized traces. Setting `cancelled` makes
        a running job return early with cancelled traces, and a waiting one raise JobCancelled.
        Raises WorkerLost or JobFailed when the worker cannot answer."""
        weight = len(job.rollout_ids)
        worker = await self._acquire(weight, cancelled)
        future = asyncio.get_running_loop().create_future()
        self._futures[job_id] = future
        worker.jobs[job_id] = weight
        worker.in_flight += weight
        WORKER_ROLLOUTS.labels(self.spec.env_key).inc(weight)
        worker.send(("run", job_id, job, timeout_s))
        self._maybe_grow()
        cancel_wait = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait({future, cancel_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not future.done():
                worker.send(("cancel", job_id))
            return await future
        except asyncio.CancelledError:
            self._abandon(worker, job_id, future)
            raise
        finally:
            cancel_wait.cancel()

    def _abandon(self, worker: _Worker, job_id: int, future: asyncio.Future) -> None:
        """The caller went away: the worker stops the job without traces, or is killed."""
        # Its outcome (traces that crossed the abandon, a lost worker) has nobody to read it.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        worker.send(("abandon", job_id))

        def overdue() -> None:
            if job_id in worker.jobs and not worker.gone.is_set():
                log.warning(
                    "env %s: worker %d did not stop an abandoned job within %.0f s; killing it",
                    self.spec.env_key,
                    worker.index,
                    ABANDON_GRACE_S,
                )
                worker.process.kill()

        asyncio.get_running_loop().call_later(ABANDON_GRACE_S, overdue)

    async def _shrink_when_idle(self) -> None:
        """Retires idle workers of an elastic pool (never below `num_workers`)."""
        tick = min(1.0, self.config.idle_shrink_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for worker in self.live:
                if self.size <= self.config.num_workers:
                    break
                if (
                    worker.ready.is_set()
                    and worker.in_flight == 0
                    and now - worker.idle_since >= self.config.idle_shrink_s
                ):
                    log.info("env %s: retiring idle worker %d", self.spec.env_key, worker.index)
                    worker.retiring = True
                    worker.send(("stop",))
                    WORKERS.labels(self.spec.env_key).set(self.size)
