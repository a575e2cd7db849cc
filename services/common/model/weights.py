"""The weight-broadcast stream shared by the trainer (sender) and inference (receiver):
one WeightUpdateHeader, then the tensors' bytes concatenated in header order, cut into
WeightChunks of at most 4 MiB, guarded by total_bytes and an xxh3-64 checksum (fast
enough that checking costs a few percent of the stream, unlike crc32)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch
import xxhash

from rlrun.common.wire import WireError
from rlrun.v1 import weights_pb2

MAX_CHUNK_BYTES = 4 * 2**20

TORCH_TO_PB = {
    torch.float32: weights_pb2.D_TYPE_FLOAT32,
    torch.float16: weights_pb2.D_TYPE_FLOAT16,
    torch.bfloat16: weights_pb2.D_TYPE_BFLOAT16,
    torch.float64: weights_pb2.D_TYPE_FLOAT64,
    torch.int64: weights_pb2.D_TYPE_INT64,
    torch.int32: weights_pb2.D_TYPE_INT32,
}
PB_TO_TORCH = {v: k for k, v in TORCH_TO_PB.items()}


def broadcast_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a weight update carries, by Hugging Face name (a tied lm_head is implied)."""
    state = model.state_dict()
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    if t.numel() == 0:  # memoryview cannot cast an empty multi-dimensional view
        return memoryview(b"")
    return memoryview(t.numpy()).cast("B")


def build_header(
    tensors: dict[str, torch.Tensor], version: int, rollback: bool = False
) -> tuple[weights_pb2.WeightUpdateHeader, list[memoryview]]:
    buffers = [_as_bytes(t) for t in tensors.values()]
    digest = xxhash.xxh3_64()
    for buf in buffers:
        digest.update(buf)
    header = weights_pb2.WeightUpdateHeader(
        version=version,
        tensors=[
            weights_pb2.TensorSpec(name=n, dtype=TORCH_TO_PB[t.dtype], shape=list(t.shape))
            for n, t in tensors.items()
        ],
        total_bytes=sum(len(b) for b in buffers),
        checksum=digest.intdigest(),
        transport=weights_pb2.WEIGHT_TRANSPORT_GRPC,
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


def iter_update_messages(
    tensors: dict[str, torch.Tensor], version: int, chunk_bytes: int = MAX_CHUNK_BYTES, rollback: bool = False
) -> Iterator[weights_pb2.WeightUpdateMessage]:
    """Header first, then chunks of at most `chunk_bytes` (capped at 4 MiB)."""
    header, buffers = build_header(tensors, version, rollback)
    yield weights_pb2.WeightUpdateMessage(header=header)
    for index, data in enumerate(_cut(buffers, min(chunk_bytes, MAX_CHUNK_BYTES))):
        yield weights_pb2.WeightUpdateMessage(
            chunk=weights_pb2.WeightChunk(version=version, index=index, data=data)
        )


class TensorLayout:
    """An update's tensors in header order, checked against the receiver's own: the name,
    dtype, shape and element count of each, as they follow one another in the stream."""

    def __init__(self, specs: Sequence[weights_pb2.TensorSpec], expected: dict[str, torch.Tensor]):
        """Fails with WireError unless `specs` names every tensor of `expected` once, each
        with its dtype and shape."""
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise WireError("header.tensors", "header.tensors has duplicate names")
        if len(names) != len(expected) or not all(name in expected for name in names):
            missing = sorted(set(expected) - set(names))
            unknown = sorted(set(names) - set(expected))
            raise WireError(
                "header.tensors",
                f"header.tensors does not match the model: missing {missing[:5]}, unknown {unknown[:5]}",
            )
        size = 0
        entries: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        offsets: dict[str, int] = {}
        for i, spec in enumerate(specs):
            target = expected[spec.name]
            dtype = PB_TO_TORCH.get(spec.dtype)
            if dtype != target.dtype:
                raise WireError(
                    f"header.tensors[{i}].dtype",
                    f"header.tensors[{i}] ({spec.name}) has dtype {dtype}, the model has {target.dtype}",
                )
            shape = tuple(spec.shape)
            if shape != target.shape:
                raise WireError(
                    f"header.tensors[{i}].shape",
                    f"header.tensors[{i}] ({spec.name}) has shape {shape}, the model has {tuple(target.shape)}",
                )
            count = target.numel()
            entries.append((spec.name, dtype, shape, count))
            offsets[spec.name] = size
            size += count * target.element_size()
        self.entries = entries
        self.total_bytes = size
        self.expected = expected
        self.offsets = offsets
        """Where each tensor's bytes start in the stream."""
        self._kept: ReceivedTensors | None = None

    def views(self, buffer: bytearray | memoryview, keep: bool = False) -> ReceivedTensors:
        """Every tensor as a view of `buffer` (the stream's bytes). `keep`: the buffer is the
        receiver's own, reused by every update; its views are kept, so that the next update
        assembled there gets them without building a tensor."""
        kept = self._kept
        if kept is not None and kept.buffer is buffer:
            return kept
        received = ReceivedTensors(self._build_views(buffer), self, buffer)
        if keep:
            self._kept = received
        return received

    def _build_views(self, buffer: bytearray | memoryview) -> dict[str, torch.Tensor]:
        entries = self.entries
        dtypes = {dtype for _, dtype, _, _ in entries}
        if len(dtypes) == 1 and len(buffer):
            # One dtype (the usual case): one view of the buffer, split into every tensor at once.
            flat = torch.frombuffer(buffer, dtype=dtypes.pop())
            pieces = flat.split([count for _, _, _, count in entries])
            return {
                name: piece.view(shape) for (name, _, shape, _), piece in zip(entries, pieces, strict=True)
            }
        out: dict[str, torch.Tensor] = {}
        for name, dtype, shape, count in entries:
            if count:
                flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=self.offsets[name])
            else:
                flat = torch.empty(0, dtype=dtype)
            out[name] = flat.reshape(shape)
        return out


class ReceivedTensors(Mapping[str, torch.Tensor]):
    """A received update's tensors: views of the buffer it was assembled in, at the byte
    offsets `layout.offsets`, each already checked against `layout.expected`. Read-only, so
    an engine that knows the buffer can skip both the check and the copy."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], layout: TensorLayout, buffer: bytearray | memoryview
    ):
        self._tensors = tensors
        self.layout = layout
        self.buffer = buffer

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


class LayoutCache:
    """The receiver's tensors, and the layout of the last header checked against them: a
    trainer sends the same tensor list with every update, so it is checked (and its views
    of a reused receive buffer built) once."""

    def __init__(self, expected: dict[str, torch.Tensor]):
        self.expected = expected
        self._checked: tuple[weights_pb2.WeightUpdateHeader, TensorLayout] | None = None

    def layout(self, header: weights_pb2.WeightUpdateHeader) -> TensorLayout:
        checked = self._checked
        if checked is None or checked[0].tensors != header.tensors:
            checked = self._checked = (header, TensorLayout(header.tensors, self.expected))
        return checked[1]


class WeightAssembler:
    """Receives one update laid out as `layout`; every check fails with WireError before
    anything is applied."""

    def __init__(
        self,
        header: weights_pb2.WeightUpdateHeader,
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

    def add(self, chunk: weights_pb2.WeightChunk) -> None:
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
