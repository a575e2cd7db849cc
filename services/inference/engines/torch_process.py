"""The torch engine in a process of its own.

The service process keeps the front end (gRPC, HTTP, receiving weight updates); a spawned
engine process runs `torch_core.run` on its main thread. With one GIL each, neither waits
for the other: the front end's per-call work no longer stalls decode steps.

Wire: a socket pair carrying length-prefixed pickles. The front end writes commands through
asyncio (never blocking its loop) and reads the core's outputs in a reader task; the engine
process reads the commands that arrived between two steps without waiting, and waits only
when it has nothing to do. Weight updates are assembled by the front end straight into a
shared-memory staging area (`weight_receive_buffer`); the engine process is then told where
each tensor sits and copies them into the model between two steps, so the bytes cross the
process boundary without a further copy. The update is committed once that message is sent:
the engine handles commands in order, so every later request is served by it, and the call
does not wait for the copy (a decode step of a large model can take a while). The next
update waits for it before it writes into the staging area.

An update over IPC or a collective crosses this socket as its checked source only
(`_FetchWeights`): the engine process, where the parameters live, maps the trainer's buffer
or joins the weight group itself (`WeightReceiver`), so those bytes never pass through here.

If the engine process dies, every open call fails and `on_dead` fires (the service stops,
so the replica restarts). If the front end dies, the engine process sees its socket close
and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rlrun.common.config import RunConfig
from rlrun.common.logs import setup_logging
from rlrun.common.memory import freeze_startup
from rlrun.common.service import limit_threads
from rlrun.common.weights.collective import CollectiveSource
from rlrun.common.weights.ipc import IpcSource
from rlrun.common.weights.protocol import ReceivedTensors
from rlrun.common.weights.receiver import WeightReceiver
from rlrun.inference import metrics
from rlrun.inference.engines.core_client import CoreClient
from rlrun.inference.engines.core_protocol import FAILED, ApplyWeights, ChannelClosed, CoreOutput, Stop, run
from rlrun.inference.engines.torch_core import TorchEngineCore

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
_STOP_TIMEOUT_S = 30.0


@dataclass
class _Ready:
    """The engine process's first message: the model is loaded."""

    specs: list[tuple[str, torch.dtype, tuple[int, ...]]]
    vocab_size: int


@dataclass
class _LoadFailed:
    """The engine process's first message instead of _Ready: why it could not load the
    model (a missing checkpoint, a bad config), for the front end to fail start with."""

    error: str


@dataclass
class _AttachStaging:
    path: str
    """A file on tmpfs the front end has mapped; the engine process maps it and unlinks it."""


@dataclass
class _ApplyStaged:
    rid: int
    version: int
    offsets: dict[str, int] | None
    """Byte offset of each tensor in the staging area; None: the canonical layout."""


@dataclass
class _FetchWeights:
    rid: int
    version: int
    source: IpcSource | CollectiveSource
    """Checked by the front end; opened by the engine process's `WeightReceiver`."""


def _frame(message) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return torch.Size(shape).numel() * dtype.itemsize


def canonical_offsets(specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> tuple[dict[str, int], int]:
    """Byte offsets of the tensors packed in broadcast order (as a sender's header lists
    them), and the total size."""
    offsets, offset = {}, 0
    for name, dtype, shape in specs:
        offsets[name] = offset
        offset += _nbytes(dtype, shape)
    return offsets, offset


def _map_file(fd: int, size: int) -> mmap.mmap:
    try:
        return mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)


def staging_directories() -> list[str]:
    return [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d)]


def _create_staging(size: int) -> tuple[str, mmap.mmap]:
    """A file both processes map: on tmpfs where it fits (a container's /dev/shm is often only
    64 MiB), else in the temp folder. The space is reserved up front, so that a full disk is
    an error here rather than a SIGBUS when an update is written."""
    for directory in staging_directories():
        fd, path = tempfile.mkstemp(prefix="rlrun-weights-", dir=directory)
        try:
            os.posix_fallocate(fd, 0, max(size, 1))
        except OSError as error:
            os.close(fd)
            os.unlink(path)
            log.info("no room for %d bytes of weight staging in %s (%s)", size, directory, error)
            continue
        return path, _map_file(fd, size)
    raise RuntimeError(f"no room for {size} bytes of weight staging in {staging_directories()}")


def staged_views(
    staging: torch.Tensor, specs: list[tuple[str, torch.dtype, tuple[int, ...]]], offsets: dict[str, int]
) -> dict[str, torch.Tensor]:
    views = {}
    for name, dtype, shape in specs:
        start = offsets[name]
        views[name] = staging[start : start + _nbytes(dtype, shape)].view(dtype).view(shape)
    return views


# -- the engine process ---------------------------------------------------------------------------


class _FrameSocket:
    """The engine process's end of the socket (blocking, with its own framing)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._sock.setblocking(True)
        self._buffer = bytearray()
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    def send(self, message) -> None:
        try:
            self._sock.sendall(_frame(message))
        except OSError as error:
            raise ChannelClosed(str(error)) from error

    def _has_frame(self) -> bool:
        buffer = self._buffer
        return len(buffer) >= _LENGTH.size and len(buffer) >= _LENGTH.size + _LENGTH.unpack_from(buffer)[0]

    def receive(self, wait: bool) -> list:
        # poll() first: on most steps nothing has arrived, and that answer is cheapest.
        while (wait and not self._has_frame()) or self._poller.poll(0):
            try:
                data = self._sock.recv(1 << 20)
            except OSError as error:
                raise ChannelClosed(str(error)) from error
            if not data:
                raise ChannelClosed("the front end closed the engine's socket")
            self._buffer += data
        messages = []
        while self._has_frame():
            (length,) = _LENGTH.unpack_from(self._buffer)
            end = _LENGTH.size + length
            messages.append(pickle.loads(self._buffer[_LENGTH.size : end]))
            del self._buffer[:end]
        return messages


class _EngineProcessChannel:
    """Turns staged weight updates into tensors of the shared staging area, and fetched ones
    (IPC, a collective) into sources its `WeightReceiver` opens."""

    def __init__(self, frames: _FrameSocket, specs, receiver: WeightReceiver):
        self._frames = frames
        self._specs = specs
        self._receiver = receiver
        self._canonical, self._size = canonical_offsets(specs)
        self._staging: torch.Tensor | None = None
        self._canonical_views: dict[str, torch.Tensor] = {}

    def receive(self, wait: bool) -> list:
        commands = []
        for message in self._frames.receive(wait):
            if isinstance(message, _AttachStaging):
                mapping = _map_file(os.open(message.path, os.O_RDWR), self._size)
                os.unlink(message.path)  # both sides have it mapped; nothing is left behind
                self._staging = torch.frombuffer(mapping, dtype=torch.uint8, count=self._size)
                self._canonical_views = staged_views(self._staging, self._specs, self._canonical)
            elif isinstance(message, _ApplyStaged):
                views = (
                    self._canonical_views
                    if message.offsets is None
                    else staged_views(self._staging, self._specs, message.offsets)
                )
                commands.append(ApplyWeights(message.rid, message.version, views))
            elif isinstance(message, _FetchWeights):
                source = self._receiver.source(message.source)
                commands.append(ApplyWeights(message.rid, message.version, source))
            else:
                commands.append(message)
        return commands

    def send(self, output: CoreOutput) -> None:
        try:
            self._frames.send(output)
        except (pickle.PicklingError, TypeError, AttributeError):
            # An exception that does not pickle: the front end gets its text instead.
            output.events = [_picklable(event) for event in output.events]
            self._frames.send(output)


def _picklable(event: tuple) -> tuple:
    if event[0] != FAILED:
        return event
    kind, rid, error = event
    return kind, rid, RuntimeError(_error_text(error))


def _error_text(error: BaseException) -> str:
    """What the front end is told of an error that stays in the engine process."""
    return f"{type(error).__name__}: {error}"


def _engine_process_main(config: RunConfig, sock: socket.socket) -> None:
    # The front end handles signals and says Stop; the engine process must not die first
    # (Ctrl-C reaches the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    limit_threads(config.inference.num_threads)
    setup_logging("inference-engine", None, config.log_level)
    frames = _FrameSocket(sock)
    try:
        core = TorchEngineCore.from_config(config)
    except Exception as error:
        frames.send(_LoadFailed(_error_text(error)))
        raise
    specs = [(name, t.dtype, tuple(t.shape)) for name, t in core.tensors.items()]
    freeze_startup()
    try:
        frames.send(_Ready(specs, core.model.config.vocab_size))
        run(core, _EngineProcessChannel(frames, specs, WeightReceiver(core.device)))
    except ChannelClosed:
        log.info("the inference front end is gone; the engine process exits")


# -- the front end --------------------------------------------------------------------------------


class TorchEngineProcess(CoreClient):
    structured_outputs = True

    def __init__(self, config: RunConfig):
        super().__init__(
            model_name=config.name,
            vocab_size=0,
            max_model_len=config.model.max_model_len,
            device=torch.device(config.inference.device),
        )
        self.config = config
        self._process: multiprocessing.process.BaseProcess | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._stopping = False
        self._specs: dict[str, torch.Tensor] = {}
        self._offsets: dict[str, int] = {}
        self._staging_path: str | None = None
        self._staging_map: mmap.mmap | None = None
        self._staging: torch.Tensor | None = None
        self._staging_views: dict[str, torch.Tensor] = {}
        self._receive_buffer: memoryview | None = None
        """The staging area as every update is assembled in it: one object, so that the
        receiver's views of it are built once (`TensorLayout.views`)."""
        self._staged: asyncio.Future | None = None
        """The last update handed to the engine process: done once it has left the staging area."""

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(
            target=_engine_process_main,
            args=(self.config, theirs),
            name="rlrun-inference-engine",
            daemon=True,
        )
        started = time.perf_counter()
        self._process.start()
        theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        try:
            ready = await _read(reader)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            code = await asyncio.to_thread(self._join, 10)
            raise RuntimeError(
                f"the engine process exited while loading the model (exit code {code})"
            ) from error
        if isinstance(ready, _LoadFailed):
            await asyncio.to_thread(self._join, 10)
            raise RuntimeError(f"the engine process could not load the model: {ready.error}")
        self.vocab_size = ready.vocab_size
        self._specs = {
            name: torch.empty(shape, dtype=dtype, device="meta") for name, dtype, shape in ready.specs
        }
        self._offsets, size = canonical_offsets(ready.specs)
        self._staging_path, self._staging_map = _create_staging(size)
        self._staging = torch.frombuffer(self._staging_map, dtype=torch.uint8, count=size)
        self._staging_views = staged_views(self._staging, ready.specs, self._offsets)
        self._receive_buffer = memoryview(self._staging_map)[:size]
        self._send(_AttachStaging(self._staging_path))
        self._reader_task = asyncio.create_task(self._read_outputs(reader))
        metrics.POLICY_VERSION.set(self._version)
        log.info(
            "engine process %d loaded the model in %.1fs", self._process.pid, time.perf_counter() - started
        )

    def _join(self, timeout: float) -> int | None:
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        return self._process.exitcode

    async def _read_outputs(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._deliver(await _read(reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        code = await asyncio.to_thread(self._join, _STOP_TIMEOUT_S)
        if self._stopping:
            return
        log.error("the engine process exited unexpectedly (exit code %s)", code)
        self._close(RuntimeError(f"the engine process exited (exit code {code})"), dead=True)

    def _send(self, command) -> None:
        if self._writer is None or self._writer.is_closing():
            raise RuntimeError("the engine process is not running")
        self._writer.write(_frame(command))

    async def stop(self) -> None:
        if self._process is None:
            return
        self._stopping = True
        if self._reader_task is not None and not self._reader_task.done():
            with contextlib.suppress(RuntimeError, ConnectionError):
                self._dispatch(Stop())
            try:
                await asyncio.wait_for(asyncio.shield(self._reader_task), _STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("the engine process did not stop within %.0fs; killing it", _STOP_TIMEOUT_S)
                self._process.kill()
                await self._reader_task
        else:
            await asyncio.to_thread(self._join, _STOP_TIMEOUT_S)
        self._writer.close()
        self._release_staging()
        self._process = None
        self._close(RuntimeError("the engine stopped"), dead=False)

    def _release_staging(self) -> None:
        """Unmapped once the last view of it is gone."""
        if self._staging_path is not None:
            with contextlib.suppress(FileNotFoundError):  # the engine process unlinks it on attach
                os.unlink(self._staging_path)
        self._staging_path = self._staging_map = self._staging = self._receive_buffer = None
        self._staging_views = {}

    # -- weights --------------------------------------------------------------------------------

    def weight_specs(self) -> dict[str, torch.Tensor]:
        return self._specs

    async def weight_receive_buffer(self) -> memoryview | None:
        await self._staging_released()
        return self._receive_buffer

    async def _staging_released(self) -> None:
        """Until the engine process has copied the last staged update into the model."""
        while self._staged is not None and not self._staged.done():
            await asyncio.wait([self._staged])

    def _offsets_in_staging(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int] | None:
        if isinstance(tensors, ReceivedTensors) and tensors.buffer is self._receive_buffer:
            return tensors.layout.offsets  # assembled in the staging area by the receiver
        base = self._staging.data_ptr()
        end = base + self._staging.numel()
        offsets = {}
        for name, tensor in tensors.items():
            start = tensor.data_ptr()
            if (
                tensor.device.type != "cpu"
                or not tensor.is_contiguous()
                or not base <= start <= end - tensor.nbytes
            ):
                return None
            offsets[name] = start - base
        return offsets

    async def _apply(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Committed once the engine process has been told where the update sits: it copies
        it in between two steps, and the staging area is not written again before then.
        The update's own tensors are free at once (they are in staging, or copied there)."""
        await self._staging_released()
        offsets = self._offsets_in_staging(tensors)
        if offsets is None:
            names = list(tensors)
            torch._foreach_copy_([self._staging_views[n] for n in names], [tensors[n] for n in names])
            offsets = self._offsets
        layout = None if offsets == self._offsets else offsets
        self._staged = self._commit(lambda rid: _ApplyStaged(rid, version, layout), version)

    def _fetch_command(self, rid: int, source: IpcSource | CollectiveSource, version: int) -> _FetchWeights:
        return _FetchWeights(rid, version, source)


async def _read(reader: asyncio.StreamReader):
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))
