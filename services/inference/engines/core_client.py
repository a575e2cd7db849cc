"""The asyncio side of a torch engine core that runs elsewhere (a thread or a process).

It numbers requests, turns the core's events back into futures and stream queues, mirrors
the status the core reports with every output (so `status()` needs no round trip), and
records the core's statistics as the `rlrun_inference_*` metrics. Subclasses say how
commands reach the core (`_send`) and feed the core's outputs to `_deliver`.

Commands reach the core in the order they are dispatched (`_dispatch`). An update's commit
is dispatched at the event loop's next turn instead of at once (`_dispatch_soon`), with
every command dispatched after it held behind it: its caller's reply goes out first, before
the core wakes up to copy the weights in, which on a machine with few cores would otherwise
take the CPU from that reply. Nothing can overtake the commit, so every request made after
the update returned is still served by it.

An update the core fetches itself (IPC, a collective: `_transfer`) is different: the sender
reuses its memory once the call returns, so the call waits until the core has copied it in,
and the version changes only then (a failed fetch changes nothing).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from abc import abstractmethod
from collections.abc import AsyncGenerator, Mapping, Sequence

import torch

from rlrun.common.errors import RequestError
from rlrun.common.weights.collective import CollectiveSource, collective_source
from rlrun.common.weights.ipc import IpcSource, ipc_source
from rlrun.common.weights.protocol import ReceivedTensors
from rlrun.common.weights.receiver import torch_sync_info
from rlrun.common.wire.inference import Completion, InferenceStatus, ScoreResult
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.weights import WeightSyncInfo, WeightUpdateHeader
from rlrun.inference import metrics
from rlrun.inference.engines.base import Engine, StreamDelta
from rlrun.inference.engines.core_protocol import (
    DELTAS,
    DONE,
    END,
    FAILED,
    Cancel,
    CoreOutput,
    CoreStats,
    Score,
    SetPaused,
    Submit,
)
from rlrun.inference.throughput import ThroughputMeter

log = logging.getLogger(__name__)

_STREAM_END = object()


def record_stats(stats: CoreStats) -> None:
    if stats.prompt_tokens:
        metrics.PROMPT_TOKENS.inc(stats.prompt_tokens)
    if stats.steps:
        metrics.GENERATED_TOKENS.inc(stats.generated_tokens)
        metrics.STEPS.inc(stats.steps)
    for reason, count in stats.finished.items():
        metrics.COMPLETIONS.labels(reason).inc(count)
    for value in stats.time_to_first_token:
        metrics.TIME_TO_FIRST_TOKEN.observe(value)
    for value in stats.inter_token_latency:
        metrics.INTER_TOKEN_LATENCY.observe(value)
    for value in stats.request_latency:
        metrics.REQUEST_LATENCY.observe(value)
    metrics.RUNNING.set(stats.running_requests)
    metrics.WAITING.set(stats.waiting_requests)


def check_update(tensors: Mapping[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every check before the first copy, so that the copies cannot fail half-way."""
    for name, tensor in tensors.items():
        target = expected.get(name)
        if target is None or target.shape != tensor.shape or target.dtype != tensor.dtype:
            raise RequestError("header.tensors", f"tensor {name} does not match the model")
    if len(tensors) != len(expected):
        raise RequestError("header.tensors", "the update does not carry every tensor of the model")


class CoreClient(Engine):
    name = "torch"

    def __init__(self, *, model_name: str, vocab_size: int, max_model_len: int, device: torch.device):
        self.model_name = model_name
        self.device = device
        """Where the core's parameters live."""
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._pending: dict[int, asyncio.Future | asyncio.Queue] = {}
        self._rids = itertools.count()
        self._version = 0
        self._paused = False
        self._running_requests = 0
        self._waiting_requests = 0
        self._meter = ThroughputMeter()
        self._closed: Exception | None = None
        self._held: list | None = None
        """Commands waiting for the loop's next turn (`_dispatch_soon`), in order."""
        self._updates = 0
        """Updates handed to the core so far: a fetch that completes after a later update was
        committed must not set its older version."""

    @abstractmethod
    def _send(self, command) -> None:
        """Hands a command to the core; never blocks the event loop."""

    def _dispatch(self, command) -> None:
        """Hands `command` to the core after every command dispatched before it."""
        if self._held is not None:
            self._held.append(command)
        else:
            self._send(command)

    def _dispatch_soon(self, command) -> None:
        """Hands `command` to the core at the event loop's next turn, still ahead of every
        command dispatched after it."""
        if self._held is None:
            self._held = []
            asyncio.get_running_loop().call_soon(self._release_held)
        self._held.append(command)

    def _release_held(self) -> None:
        held, self._held = self._held, None
        try:
            for command in held:
                self._send(command)
        except (RuntimeError, ConnectionError) as error:
            # The core is gone: fail every call that waits on it, those held here included.
            log.error("could not hand held commands to the engine: %s", error)
            self._close(RuntimeError(f"the engine is not running: {error}"), dead=True)

    @abstractmethod
    async def _apply(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Hands a checked update to the core (through `_commit`); returns once it is committed."""

    @abstractmethod
    def _fetch_command(self, rid: int, source: IpcSource | CollectiveSource, version: int):
        """The core's command that fetches the update at `source` and copies it in."""

    # -- the core's outputs ----------------------------------------------------------------------

    def _deliver(self, output: CoreOutput) -> None:
        stats = output.stats
        record_stats(stats)
        self._running_requests = stats.running_requests
        self._waiting_requests = stats.waiting_requests
        if stats.generated_tokens:
            self._meter.add(stats.at, stats.generated_tokens)
        pending = self._pending
        for event in output.events:
            kind, rid = event[0], event[1]
            if kind == DELTAS:
                queue = pending.get(rid)
                if queue is not None:
                    queue.put_nowait(event[2])
                continue
            target = pending.pop(rid, None)
            if target is None:  # its caller went away (cancelled)
                continue
            if kind == END:
                target.put_nowait(_STREAM_END)
            elif kind == DONE:
                if not target.done():
                    target.set_result(event[2])
            elif kind == FAILED:
                if isinstance(target, asyncio.Queue):
                    target.put_nowait(event[2])
                elif not target.done():
                    target.set_exception(event[2])

    def _close(self, error: Exception, *, dead: bool) -> None:
        """No core any more: every open call fails with `error`; `dead` means it was not asked to stop."""
        if self._closed is None:
            self._closed = error
        pending, self._pending = self._pending, {}
        for target in pending.values():
            if isinstance(target, asyncio.Queue):
                target.put_nowait(error)
            elif not target.done():
                target.set_exception(error)
        if dead and self.on_dead is not None:
            self.on_dead(error)

    def _open(self, waiter: asyncio.Future | asyncio.Queue) -> int:
        if self._closed is not None:
            raise RuntimeError(f"the engine is not running: {self._closed}")
        rid = next(self._rids)
        self._pending[rid] = waiter
        return rid

    def _post(self, make_command) -> tuple[int, asyncio.Future]:
        """Dispatches the command `make_command(rid)`; the future gets its answer."""
        future = asyncio.get_running_loop().create_future()
        rid = self._open(future)
        self._dispatch(make_command(rid))
        return rid, future

    async def _call(self, make_command):
        """Sends the command `make_command(rid)` and waits for its answer."""
        rid, future = self._post(make_command)
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    # -- Engine ------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    def _set_version(self, version: int) -> None:
        self._version = version
        metrics.POLICY_VERSION.set(version)

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        future = asyncio.get_running_loop().create_future()
        rid = self._open(future)
        self._dispatch(Submit(rid, list(prompt), params, False, time.perf_counter()))
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                log.debug("request %r cancelled", request_id)
                self._dispatch(Cancel(rid))
            raise

    async def stream(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> AsyncGenerator[list[StreamDelta], None]:
        queue: asyncio.Queue = asyncio.Queue()
        rid = self._open(queue)
        self._dispatch(Submit(rid, list(prompt), params, True, time.perf_counter()))
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _STREAM_END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished and self._pending.pop(rid, None) is not None:
                log.debug("stream %r closed early", request_id)
                self._dispatch(Cancel(rid))

    async def update_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> float:
        if not (isinstance(tensors, ReceivedTensors) and tensors.layout.expected is self.weight_specs()):
            check_update(tensors, self.weight_specs())
        started = time.perf_counter()
        await self._apply(tensors, version)
        return time.perf_counter() - started

    def _commit(self, make_command, version: int) -> asyncio.Future:
        """Dispatches the update command `make_command(rid)` at the loop's next turn: committed
        from here on, since the core handles commands in the order they were dispatched, so
        every later request is served by it. The future resolves once the core has copied it
        in (its apply seconds)."""
        applied = asyncio.get_running_loop().create_future()
        self._dispatch_soon(make_command(self._open(applied)))
        self._updates += 1
        self._set_version(version)
        applied.add_done_callback(self._update_applied)
        return applied

    def _update_applied(self, applied: asyncio.Future) -> None:
        if applied.cancelled():
            return
        error = applied.exception()
        if error is None:
            metrics.WEIGHT_APPLY_SECONDS.observe(applied.result())
        elif self._closed is None:
            # Committed updates were all checked here first: the engine is broken.
            log.error("the engine failed to apply committed weights of version %d: %s", self._version, error)
            self._close(RuntimeError(f"the engine failed to apply committed weights: {error}"), dead=True)

    async def score(
        self, token_ids: Sequence[int], start: int, temperature: float, top_logprobs: int = 0
    ) -> ScoreResult:
        return await self._call(lambda rid: Score(rid, list(token_ids), start, temperature, top_logprobs))

    async def receive_weights_nccl(self, header: WeightUpdateHeader) -> float:
        return await self._transfer(
            collective_source(header, self.weight_specs(), self.device), header.version
        )

    async def receive_weights_ipc(self, header: WeightUpdateHeader) -> float:
        return await self._transfer(ipc_source(header, self.weight_specs()), header.version)

    def weight_sync_info(self) -> WeightSyncInfo:
        return torch_sync_info(self.device)

    async def _transfer(self, source: IpcSource | CollectiveSource, version: int) -> float:
        """Has the core fetch the update and copy it in between two steps; returns once it
        has (the sender's memory is free again), with the seconds it took."""
        started = time.perf_counter()
        self._updates += 1
        _, done = self._post(lambda rid: self._fetch_command(rid, source, version))
        # Recorded even if the caller gives up waiting: the core may still apply it.
        done.add_done_callback(functools.partial(self._fetched, self._updates, version))
        await asyncio.shield(done)
        return time.perf_counter() - started

    def _fetched(self, update: int, version: int, done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        metrics.WEIGHT_APPLY_SECONDS.observe(done.result())
        if update == self._updates:
            self._set_version(version)

    def status(self) -> InferenceStatus:
        return self._status(
            running=self._running_requests,
            waiting=self._waiting_requests,
            tokens_per_s=self._meter.rate(time.perf_counter()),
            paused=self._paused,
        )

    async def pause(self) -> None:
        self._paused = await self._call(lambda rid: SetPaused(rid, True))

    async def resume(self) -> None:
        self._paused = await self._call(lambda rid: SetPaused(rid, False))
