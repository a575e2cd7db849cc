"""Watching a service from outside, as an operator would: its processes' memory and CPU time
from /proc (the process and every descendant, e.g. an env-server's pool workers or the
inference engine's process), sampled in a thread, and a gRPC health probe loop with a probe
timeout, as a kubelet runs one.

Used by the tests that send hostile or heavy requests (tests/integration/limits/): how long the
server kept working after a call ended (its CPU time stops growing) and whether its memory came
back, measured on the server's side, not on the client's clock.
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlrun.common.procfs import cpu_seconds, descendants, rss_bytes


@dataclass
class Sample:
    at: float
    """time.monotonic()"""
    rss: int
    """bytes, summed over the process tree"""
    cpu_s: dict[int, float]
    """CPU seconds of each process of the tree, by pid"""

    def busy_cores(self, later: Sample, pids: frozenset[int] | None = None) -> float:
        """Cores the tree used from this sample to `later`: what every process alive at
        `later` used since this sample (all of it, for a process started in between); only
        the processes `pids` when given (e.g. those that were there when a call began, not a
        worker started later to replace one)."""
        used = sum(
            cpu - self.cpu_s.get(pid, 0.0) for pid, cpu in later.cpu_s.items() if pids is None or pid in pids
        )
        return used / (later.at - self.at)


def sample_tree(pid: int) -> Sample:
    pids = descendants(pid)
    return Sample(time.monotonic(), sum(rss_bytes(p) for p in pids), {p: cpu_seconds(p) for p in pids})


class _InThread(abc.ABC):
    """Runs `_run` in a daemon thread for the length of a `with` block; `_run` loops until
    `_stop` is set."""

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @abc.abstractmethod
    def _run(self) -> None:
        """The watcher's own loop."""

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class TreeSampler(_InThread):
    """Samples a process tree every `interval_s` in a thread (`with TreeSampler(pid) as s:`)."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._start_thread()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(sample_tree(self.pid))
            self._stop.wait(self.interval_s)

    def peak_rss(self, since: float = 0.0) -> int:
        return max((s.rss for s in self.samples if s.at >= since), default=0)

    def busy_until(
        self, since: float, idle_cores: float, window_s: float, pids: frozenset[int] | None = None
    ) -> float:
        """When the tree's work stopped: the end of the last `window_s` after `since` over which
        it (or its processes `pids`) used at least `idle_cores` of a core (`since` when it
        never did). Only meaningful once the samples run at least `window_s` past it.
        `idle_cores` well below what a starved process gets on a loaded machine (an idle
        service uses next to nothing), so that slow work never reads as none."""
        samples = [s for s in list(self.samples) if s.at >= since]
        last_busy, j = since, 0
        for a in samples:
            while j < len(samples) and samples[j].at - a.at < window_s:
                j += 1
            if j == len(samples):
                break
            b = samples[j]
            if a.busy_cores(b, pids) >= idle_cores:
                last_busy = b.at
        return last_busy

    def wait_quiet(
        self,
        since: float,
        timeout_s: float,
        idle_cores: float = 0.03,
        window_s: float = 1.0,
        pids: frozenset[int] | None = None,
    ) -> float:
        """Waits until the tree (or `pids`) has been idle for `window_s` (or `timeout_s`
        passed); returns `busy_until`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(self.interval_s)
            until = self.busy_until(since, idle_cores, window_s, pids)
            if self.samples and self.samples[-1].at - until >= window_s:
                return until
        return self.busy_until(since, idle_cores, window_s, pids)


@dataclass
class HealthProbe(_InThread):
    """grpc.health.v1 Check every `period_s` with a deadline of `timeout_s` (a kubelet's
    probe), in a thread; `failures` holds each probe that did not answer SERVING in time."""

    address: str
    timeout_s: float = 1.0
    period_s: float = 0.25
    service: str = ""
    probes: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    failures_in_a_row: int = 0
    """The longest run of consecutive failed probes: a kubelet restarts a container after
    `failureThreshold` (3 by default) of them."""

    def __post_init__(self) -> None:
        self._start_thread()

    def _run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            in_a_row = 0
            while not self._stop.is_set():
                started = time.monotonic()
                failure = self._probe(stub)
                if failure is not None:
                    self.failures.append(failure)
                in_a_row = in_a_row + 1 if failure is not None else 0
                self.failures_in_a_row = max(self.failures_in_a_row, in_a_row)
                self.probes += 1
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def _probe(self, stub: health_pb2_grpc.HealthStub) -> str | None:
        """Why one probe failed (None: it answered SERVING in time)."""
        started = time.monotonic()
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=self.service), timeout=self.timeout_s)
        except grpc.RpcError as error:
            return f"{error.code().name} after {time.monotonic() - started:.2f} s"
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            return f"status {reply.status}"
        return None
