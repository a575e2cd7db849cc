"""Receiving one UpdateWeights client stream: the header, then the chunks, checked against
the engine's tensors (`LayoutCache`, `WeightAssembler`) before anything is applied.

Status mapping (the servicer turns these into gRPC codes):
- a message that breaks the contract (no header first, a second header, a tensor list,
  dtype, shape or total that does not match, a wrong chunk index or version, a checksum
  mismatch) -> `RequestError` / `WireError` -> INVALID_ARGUMENT;
- a stream that ends early (no message at all, or fewer bytes than announced) ->
  `StreamBroken` -> ABORTED.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch

from rlrun.common.errors import RequestError
from rlrun.common.model.weights import LayoutCache, WeightAssembler
from rlrun.v1 import weights_pb2

HEADER_ONLY = {
    weights_pb2.WEIGHT_TRANSPORT_NCCL: ("nccl", "an NCCL update (the tensors go over the collective)"),
    weights_pb2.WEIGHT_TRANSPORT_IPC: ("ipc", "an IPC update (the tensors stay in the trainer's buffer)"),
}
"""Transports whose stream is the header alone: the header field that says where the tensors are."""


class StreamBroken(Exception):
    """The client stream ended before the update was complete."""


@dataclass
class ReceivedUpdate:
    header: weights_pb2.WeightUpdateHeader
    tensors: dict[str, torch.Tensor] | None
    """None for a header-only update (`HEADER_ONLY`): the engine fetches the tensors."""
    bytes_received: int


async def receive_update(
    messages: AsyncIterator[weights_pb2.WeightUpdateMessage],
    layouts: LayoutCache,
    buffer: memoryview | None = None,
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
    messages: AsyncIterator[weights_pb2.WeightUpdateMessage],
    layouts: LayoutCache,
    buffer: memoryview | None,
) -> ReceivedUpdate:
    first = await anext(messages, None)
    if first is None:
        raise StreamBroken("the stream ended before the header")
    if first.WhichOneof("payload") != "header":
        raise RequestError("header", "the first message of UpdateWeights must be a header")
    header = first.header
    if header.version < 0:
        raise RequestError("header.version", f"header.version must be >= 0, got {header.version}")
    fetched = HEADER_ONLY.get(header.transport)
    if fetched is not None:
        field, what = fetched
        if not header.HasField(field):
            raise RequestError(f"header.{field}", f"{what} needs header.{field}")
        async for message in messages:
            raise RequestError(
                message.WhichOneof("payload") or "payload",
                f"{what} carries only the header; the replica fetches the tensors",
            )
        # Counted once the engine has fetched them, which checks the total against the model.
        return ReceivedUpdate(header, None, header.total_bytes)
    assembler = WeightAssembler(header, layouts.layout(header), buffer)
    async for message in messages:
        if message.WhichOneof("payload") != "chunk":
            raise RequestError("header", "UpdateWeights carries exactly one header, first")
        assembler.add(message.chunk)
    if assembler.received != len(assembler.buffer):
        raise StreamBroken(f"the stream ended after {assembler.received} of {len(assembler.buffer)} bytes")
    return ReceivedUpdate(header, assembler.finish(), assembler.received)
