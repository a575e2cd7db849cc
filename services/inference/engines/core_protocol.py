"""The torch engine core's command protocol: the commands a front end sends it, the events and
statistics it sends back, the channel between the two, and `run`, which drives a core from a
channel: it takes the commands that arrived, runs one step, and sends what the step produced.
The channel is a thread hand-off for the in-process engine (`torch_engine.TorchEngine`) or a
socket to the front end for the engine process (`torch_process.TorchEngineProcess`); the core
knows neither, nor asyncio. Commands are handled only between steps."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlrun.common.memory import release_memory
from rlrun.common.weights.protocol import WeightSource
from rlrun.common.wire.sampling import SamplingParams

log = logging.getLogger("rlrun.inference.engines.torch_core")

STATS_INTERVAL_S = 0.05
"""Longest a step's statistics wait for an output that carries answers."""

# -- commands (to the core) -------------------------------------------------------------------


@dataclass
class Submit:
    rid: int
    prompt: list[int]
    params: SamplingParams
    streaming: bool
    arrival: float
    """time.perf_counter() at the front end (CLOCK_MONOTONIC: comparable across processes)."""


@dataclass
class Cancel:
    rid: int


@dataclass
class Score:
    rid: int
    token_ids: list[int]
    start: int
    temperature: float
    top_logprobs: int = 0


@dataclass
class ApplyWeights:
    rid: int
    version: int
    tensors: Mapping[str, torch.Tensor] | WeightSource
    """Every tensor of the model, already checked against it (`CoreClient.update_weights`), or
    where to fetch them from (IPC, a collective): fetched between two steps, then copied in."""


@dataclass
class SetPaused:
    rid: int
    paused: bool


@dataclass
class Stop:
    """Ends `run`: every open request ends with what it has, finish_reason abort."""


# -- events (from the core) -------------------------------------------------------------------

DONE = "done"  # (DONE, rid, value): a request, score, update or pause/resume finished
FAILED = "failed"  # (FAILED, rid, exception)
DELTAS = "deltas"  # (DELTAS, rid, [StreamDelta]): new tokens of a streaming request
END = "end"  # (END, rid): a streaming request finished


@dataclass
class CoreStats:
    """What happened since the previous output; the front end turns it into metrics."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    finished: Counter = field(default_factory=Counter)
    """Finished samples by finish reason."""
    time_to_first_token: list[float] = field(default_factory=list)
    inter_token_latency: list[float] = field(default_factory=list)
    request_latency: list[float] = field(default_factory=list)
    running_requests: int = 0
    waiting_requests: int = 0
    at: float = 0.0
    """Clock reading of the last step (for the tokens/s meter)."""


@dataclass
class CoreOutput:
    events: list[tuple]
    stats: CoreStats


class CoreChannel(Protocol):
    def receive(self, wait: bool) -> list[Any]:
        """The commands that arrived; with `wait`, blocks until there is at least one."""

    def send(self, output: CoreOutput) -> None: ...


class Core(Protocol):
    """What `run` drives (`torch_core.TorchEngineCore`)."""

    def handle(self, command) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> None: ...

    def has_events(self) -> bool: ...

    def take_output(self) -> CoreOutput | None: ...

    def fail_all(self, error: Exception) -> None: ...

    def abort_all(self) -> None: ...


class ChannelClosed(Exception):
    """The other side of a channel is gone (the front end of an engine process exited)."""


def run(core: Core, channel: CoreChannel) -> None:
    """Drives `core` until a `Stop` command: the commands that arrived, one step, its output.

    A crash of the core itself fails every open request before the exception propagates,
    so nothing waits forever on a dead engine."""
    try:
        with torch.inference_mode():
            _serve(core, channel)
    except ChannelClosed:
        raise  # nobody is left to tell
    except BaseException as error:
        log.exception("the engine crashed; failing every open request")
        core.fail_all(error if isinstance(error, Exception) else RuntimeError("the engine crashed"))
        _flush(core, channel)
        raise
    _flush(core, channel)


def _serve(core: Core, channel: CoreChannel) -> None:
    flushed_at = 0.0
    worked = False
    while True:
        idle = not core.has_work()
        if idle:
            _flush(core, channel)
            if worked:
                release_memory()  # a burst is over: its batches' memory goes back
        worked = not idle
        for command in channel.receive(wait=idle):
            if isinstance(command, Stop):
                core.abort_all()
                return
            core.handle(command)
        core.step()
        # Answers go out at once; statistics alone wait a little, since every output costs
        # the decode loop a send and wakes the other side.
        now = time.perf_counter()
        if core.has_events() or now - flushed_at >= STATS_INTERVAL_S:
            _flush(core, channel)
            flushed_at = now


def _flush(core: Core, channel: CoreChannel) -> None:
    output = core.take_output()
    if output is not None:
        channel.send(output)
