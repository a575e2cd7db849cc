"""The UpdateWeights stream (the grpc transport): one WeightUpdateHeader, then the tensors'
bytes concatenated in header order, cut into WeightChunks of at most 4 MiB, guarded by
total_bytes and an xxh3-64 checksum (fast enough that checking costs a few percent of the
stream, unlike crc32). Both halves: `GrpcWeightBroadcaster` (the trainer's) and `receive_update`
with `WeightAssembler` (the replica's). Every transport's update opens with this stream's
header; for a fetched one (ipc, nccl) it is the whole stream.

Status mapping on the receiving side (the servicer turns these into gRPC codes):
- a message that breaks the contract (no header first, a second header, a tensor list,
  dtype, shape or total that does not match, a wrong chunk index or version, a checksum
  mismatch) -> `RequestError` / `WireError` -> INVALID_ARGUMENT;
- a stream that ends early (no message at all, or fewer bytes than announced) ->
  `StreamBroken` -> ABORTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass

import torch
import xxhash

from rlrun.common.errors import RequestError
from rlrun.common.weights.protocol import (
    ReceivedTensors,
    TensorLayout,
    Update,
    WeightSender,
    tensor_specs,
    total_bytes,
)
from rlrun.common.wire import WireError
from rlrun.common.wire.weights import (
    WeightChunk,
    WeightUpdateHeader,
    WeightUpdateStream,
    update_message_from_proto,
    update_messages,
)

MAX_CHUNK_BYTES = 4 * 2**20


# ---- the sending half -----------------------------------------------------------------------


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    if t.numel() == 0:  # memoryview cannot cast an empty multi-dimensional view
        return memoryview(b"")
    return t.numpy().data.cast("B")


def build_header(
    tensors: dict[str, torch.Tensor], version: int, rollback: bool = False
) -> tuple[WeightUpdateHeader, list[memoryview]]:
    buffers = [_as_bytes(t) for t in tensors.values()]
    digest = xxhash.xxh3_64()
    for buf in buffers:
        digest.update(buf)
    header = WeightUpdateHeader(
        version=version,
        tensors=tensor_specs(tensors),
        total_bytes=sum(len(b) for b in buffers),
        checksum=digest.intdigest(),
        transport="grpc",
        rollback=rollback,
    )
    return header, buffers


def _cut(buffers: list[memoryview], chunk_bytes: int) -> Iterator[bytes]:
    """The concatenation of `buffers` in pieces of `chunk_bytes` (the last may be shorter),
    copied once: a piece inside one tensor is a slice, only pieces across tensors are joined."""
    parts: list[memoryview] = []
    size = 0
    for buf in buffers:
        offset = 0
        while offset < len(buf):
            take = min(chunk_bytes - size, len(buf) - offset)
            parts.append(buf[offset : offset + take])
            size += take
            offset += take
            if size == chunk_bytes:
                yield bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
                parts, size = [], 0
    if parts:
        yield b"".join(parts)


def chunks(
    buffers: list[memoryview], version: int, chunk_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[WeightChunk]:
    """The update's chunks, of at most `chunk_bytes` (capped at 4 MiB), cut as they are read."""
    for index, data in enumerate(_cut(buffers, min(chunk_bytes, MAX_CHUNK_BYTES))):
        yield WeightChunk(version, index, data)


def iter_update_messages(
    tensors: dict[str, torch.Tensor], version: int, chunk_bytes: int = MAX_CHUNK_BYTES, rollback: bool = False
) -> WeightUpdateStream:
    """The whole stream: header first, then chunks of at most `chunk_bytes` (capped at 4 MiB)."""
    header, buffers = build_header(tensors, version, rollback)
    return update_messages(header, chunks(buffers, version, chunk_bytes))


@dataclass
class StreamUpdate(Update):
    tensors: dict[str, torch.Tensor] | None = None
    rollback: bool = False


class GrpcWeightBroadcaster(WeightSender):
    """One UpdateWeights stream per replica, all replicas concurrently. Chunks are cut while
    the stream goes out (as a raw client would), not built up front; a replica answering
    UNAVAILABLE gets the whole stream again, from its header."""

    transport = "grpc"
    tensors_on_cpu = True

    async def prepare(self, tensors, version, rollback, targets) -> StreamUpdate:
        return StreamUpdate(version, total_bytes(tensors), tensors=tensors, rollback=rollback)

    async def send(self, address: str, update: Update) -> None:
        assert isinstance(update, StreamUpdate) and update.tensors is not None
        header, buffers = build_header(update.tensors, update.version, update.rollback)
        chunk_bytes = int(self.config.chunk_mb * 2**20)
        await self.update_weights(address, header, chunks(buffers, update.version, chunk_bytes))


# ---- the receiving half ---------------------------------------------------------------------


class LayoutCache:
    """The receiver's tensors, and the layout of the last header checked against them: a
    trainer sends the same tensor list with every update, so it is checked (and its views
    of a reused receive buffer built) once."""

    def __init__(self, expected: dict[str, torch.Tensor]):
        self.expected = expected
        self._checked: tuple[WeightUpdateHeader, TensorLayout] | None = None

    def layout(self, header: WeightUpdateHeader) -> TensorLayout:
        checked = self._checked
        if checked is None or checked[0].tensors != header.tensors:
            checked = self._checked = (header, TensorLayout(header.tensors, self.expected))
        return checked[1]


class WeightAssembler:
    """Receives one update laid out as `layout`; every check fails with WireError before
    anything is applied."""

    def __init__(
        self,
        header: WeightUpdateHeader,
        layout: TensorLayout,
        buffer: memoryview | None = None,
    ):
        """`buffer`: where to assemble (the receiver's staging area), else a new bytearray."""
        size = layout.total_bytes
        if header.total_bytes != size:
            raise WireError(
                "header.total_bytes",
                f"header.total_bytes is {header.total_bytes} but the tensors need {size}",
            )
        self.header = header
        self.layout = layout
        if buffer is not None and len(buffer) != size:
            raise ValueError(f"the receive buffer holds {len(buffer)} bytes, the model's tensors {size}")
        self.buffer = bytearray(size) if buffer is None else buffer
        self._reused_buffer = buffer is not None
        self.received = 0
        self.next_index = 0
        self.digest = xxhash.xxh3_64()

    def add(self, chunk: WeightChunk) -> None:
        if chunk.version != self.header.version:
            raise WireError(
                "chunk.version",
                f"chunk {chunk.index} is for version {chunk.version}, the header announced {self.header.version}",
            )
        if chunk.index != self.next_index:
            raise WireError("chunk.index", f"chunk.index is {chunk.index}, expected {self.next_index}")
        # Read once: every read of a bytes field builds a new copy of the payload.
        data = chunk.data
        if len(data) > MAX_CHUNK_BYTES:
            raise WireError("chunk.data", f"chunk {chunk.index} has {len(data)} bytes, more than 4 MiB")
        end = self.received + len(data)
        if end > len(self.buffer):
            raise WireError("chunk.data", f"chunks carry more than header.total_bytes ({len(self.buffer)})")
        self.buffer[self.received : end] = data
        # Checksummed as it arrives, so finish() does not make a second pass over the bytes.
        self.digest.update(data)
        self.received = end
        self.next_index += 1

    def finish(self) -> ReceivedTensors:
        """The received tensors (views of the receive buffer), after the length and checksum checks."""
        if self.received != len(self.buffer):
            raise WireError("chunks", f"stream ended after {self.received} of {len(self.buffer)} bytes")
        checksum = self.digest.intdigest()
        if checksum != self.header.checksum:
            raise WireError(
                "header.checksum", f"checksum mismatch: header {self.header.checksum}, data {checksum}"
            )
        return self.layout.views(self.buffer, keep=self._reused_buffer)


class StreamBroken(Exception):
    """The client stream ended before the update was complete."""


@dataclass
class ReceivedUpdate:
    header: WeightUpdateHeader
    tensors: Mapping[str, torch.Tensor] | None
    """None for a fetched transport (ipc, nccl): the engine fetches the tensors."""
    bytes_received: int


FETCHED = {
    "nccl": ("nccl", "an NCCL update (the tensors go over the collective)"),
    "ipc": ("ipc", "an IPC update (the tensors stay in the trainer's buffer)"),
}
"""Transports whose stream is the header alone: the header field that says where the tensors are."""


async def receive_update(
    messages: AsyncIterator, layouts: LayoutCache, buffer: memoryview | None = None
) -> ReceivedUpdate:
    """`layouts`: the engine's tensors (`Engine.weight_specs`); `buffer`: where the engine
    wants the bytes assembled (`Engine.weight_receive_buffer`)."""
    try:
        return await _receive(messages, layouts, buffer)
    except RequestError:
        # Read the client's stream to its end before the status goes out: a client still
        # sending when the call closes sees a transport error (INTERNAL) instead of the
        # INVALID_ARGUMENT that names its mistake.
        async for _ in messages:
            pass
        raise


async def _receive(
    messages: AsyncIterator, layouts: LayoutCache, buffer: memoryview | None
) -> ReceivedUpdate:
    first = await anext(messages, None)
    if first is None:
        raise StreamBroken("the stream ended before the header")
    header = update_message_from_proto(first)
    if not isinstance(header, WeightUpdateHeader):
        raise RequestError("header", "the first message of UpdateWeights must be a header")
    fetched = FETCHED.get(header.transport or "")
    if fetched is not None:
        field, what = fetched
        if getattr(header, field) is None:
            raise RequestError(f"header.{field}", f"{what} needs header.{field}")
        async for message in messages:
            extra = update_message_from_proto(message)
            kind = "header" if isinstance(extra, WeightUpdateHeader) else "chunk" if extra else "payload"
            raise RequestError(kind, f"{what} carries only the header; the replica fetches the tensors")
        # Counted once the engine has fetched them, which checks the total against the model.
        return ReceivedUpdate(header, None, header.total_bytes)
    assembler = WeightAssembler(header, layouts.layout(header), buffer)
    async for message in messages:
        chunk = update_message_from_proto(message)
        if not isinstance(chunk, WeightChunk):
            raise RequestError("header", "UpdateWeights carries exactly one header, first")
        assembler.add(chunk)
    if assembler.received != len(assembler.buffer):
        raise StreamBroken(f"the stream ended after {assembler.received} of {len(assembler.buffer)} bytes")
    return ReceivedUpdate(header, assembler.finish(), assembler.received)
