"""Weight sync as one protocol, shared by the trainer (which sends) and the inference replicas
(which receive): every transport is one module of this package holding both its halves.

- `grpc_stream`: the tensor bytes in the UpdateWeights stream (chunks of at most 4 MiB);
- `ipc`: the trainer's staging buffer, mapped by replicas on its node (CUDA IPC, or shared
  memory on CPU);
- `collective`: an NCCL (or gloo) broadcast from the trainer, rank 0 of a weight group.

Every update opens one UpdateWeights client stream per replica: a WeightUpdateHeader first
(its `transport` says where the bytes are), then chunks for grpc only. The sending half of a
transport is a `WeightSender`: this base owns `broadcast()` (the replicas of an update, one
`BroadcastResult` each, UNAVAILABLE retried with backoff, the fallback transport for replicas
that failed), and a transport writes only its `prepare` (once per update) and its `send` (to
one replica). The receiving half is `grpc_stream.receive_update` (the stream, checked), then, for a fetched
transport, a `WeightSource` that the transport's receiver opens where the parameters live.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import grpc
import torch

from rlrun.common.config.trainer import BroadcastConfig
from rlrun.common.errors import RequestError
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.wire import WireError
from rlrun.common.wire.inference import weights_applied_from_proto
from rlrun.common.wire.trainer import BroadcastResult
from rlrun.common.wire.weights import TensorSpec, WeightChunk, WeightUpdateHeader, update_messages
from rlrun.v1 import inference_pb2_grpc

log = logging.getLogger("rlrun.trainer.broadcast")

BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0


# ---- tensors --------------------------------------------------------------------------------


def broadcast_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a weight update carries, by Hugging Face name (a tied lm_head is implied):
    all of them, or (LoRA) only those training changes (`CausalLM.trained`)."""
    state = model.state_dict()
    trained = getattr(model, "trained", None)
    if trained is not None:
        state = {name: tensor for name, tensor in state.items() if name in trained}
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def dtype_name(dtype: torch.dtype) -> str:
    """As the wire names it (`float32`, `bfloat16`, ...)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype | None:
    """The dtype a wire name stands for; None for one that is not a torch dtype."""
    dtype = getattr(torch, name, None) if name else None
    return dtype if isinstance(dtype, torch.dtype) else None


def tensor_specs(tensors: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(n, dtype_name(t.dtype), list(t.shape)) for n, t in tensors.items()]


def total_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@functools.cache
def node_id() -> str:
    """Equal for two processes that can map each other's memory: same host, same boot, same
    IPC namespace (two containers on one machine share the boot id but not /dev/shm)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    try:
        namespace = os.readlink("/proc/self/ns/ipc")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{boot_id}/{namespace}"


class TensorLayout:
    """An update's tensors in header order, checked against the receiver's own: the name,
    dtype, shape and element count of each, as they follow one another in the stream."""

    def __init__(self, specs: Sequence[TensorSpec], expected: dict[str, torch.Tensor]):
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
            dtype = torch_dtype(spec.dtype)
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

    @property
    def specs(self) -> Specs:
        return tuple((name, dtype, shape) for name, dtype, shape, _ in self.entries)

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

    def check_total(self, header: WeightUpdateHeader) -> None:
        if header.total_bytes != self.total_bytes:
            raise RequestError(
                "header.total_bytes",
                f"header.total_bytes is {header.total_bytes} but the tensors need {self.total_bytes}",
            )


Specs = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]
"""(name, dtype, shape) of every tensor, in stream order: what a fetched source carries."""


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


# ---- the sending half ---------------------------------------------------------------------


class WeightBroadcaster(Protocol):
    """What the trainer broadcasts through: one transport (`WeightSender`) or the per-replica
    choice of one (`trainer.weight_sync.AutoWeightBroadcaster`)."""

    @property
    def tensors_on_cpu(self) -> bool:
        """Whether `broadcast` wants CPU tensors (gRPC) or tensors left on the GPU (NCCL)."""
        ...

    @property
    def addresses(self) -> list[str]:
        """Every replica it can reach, in configured order."""
        ...

    async def set_addresses(self, addresses: list[str]) -> None:
        """The replica set changed (inference scaled): opens and closes channels to match."""
        ...

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[BroadcastResult]:
        """To the replicas `to` (default: all), one result each. `rollback`: the version may
        be older than the replicas' (the trainer went back to a checkpoint)."""
        ...

    async def close(self) -> None: ...


def replica_client_options(base: ClientOptions, config: BroadcastConfig) -> ClientOptions:
    """No channel-level retries: a client stream is retried here, whole, from its header."""
    return dataclasses.replace(base, retries=1, deadline_s=config.timeout_s)


async def retry_unavailable(address: str, attempt_call, retries: int) -> tuple[object | None, str]:
    """Runs `attempt_call()` until it succeeds, fails with a code other than UNAVAILABLE, or
    has been retried `retries` times. Returns (response, "") or (None, error)."""
    attempt = 0
    while True:
        try:
            return await attempt_call(), ""
        except grpc.aio.AioRpcError as error:
            message = f"{error.code().name}: {error.details()}"
            if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == retries:
                return None, message
            delay = min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt)
            attempt += 1
            log.warning(
                "replica %s unavailable (attempt %d of %d), retrying in %.1fs: %s",
                address,
                attempt,
                retries + 1,
                delay,
                message,
            )
            await asyncio.sleep(delay)


async def resize_channels(
    channels: dict[str, grpc.aio.Channel], addresses: list[str], options: ClientOptions
) -> None:
    """`channels` (address -> channel) made to hold exactly `addresses`, in their order."""
    gone = [channels.pop(a) for a in list(channels) if a not in addresses]
    await asyncio.gather(*(channel.close() for channel in gone))
    kept = dict(channels)
    channels.clear()
    channels.update({a: kept.get(a) or open_channel(a, options) for a in addresses})


class ReplicaChannels:
    """What every broadcaster keeps: one gRPC channel per replica, in configured order, with
    the options a weight update's stream runs under."""

    def __init__(self, addresses: list[str], config: BroadcastConfig, client: ClientOptions):
        self.config = config
        self.options = replica_client_options(client, config)
        self.channels: dict[str, grpc.aio.Channel] = {a: open_channel(a, self.options) for a in addresses}

    @property
    def addresses(self) -> list[str]:
        return list(self.channels)

    def targets(self, to: Sequence[str] | None) -> list[str]:
        """The replicas of one broadcast: `to`, or all of them."""
        return list(self.channels) if to is None else list(to)

    async def set_addresses(self, addresses: list[str]) -> None:
        await resize_channels(self.channels, addresses, self.options)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))

    def stub(self, address: str) -> inference_pb2_grpc.InferenceServiceStub:
        return inference_pb2_grpc.InferenceServiceStub(self.channels[address])


@dataclass
class Update:
    """One update as a transport prepared it for its replicas."""

    version: int
    total_bytes: int
    started: float | None = None
    """When set, every replica's seconds count from here (the transport's own preparation,
    such as staging, is part of the sync); else from the replica's own send."""
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    """Replicas the update does not go to, with why (not reachable)."""


class WeightSender(ReplicaChannels, ABC):
    """The sending half of one transport. `broadcast` is the same for all of them."""

    transport: ClassVar[str]
    """Its name in `trainer.broadcast.transport` (and in BroadcastResult.transport)."""
    tensors_on_cpu: bool = False
    fallback: WeightSender | None = None
    """Replicas that fail an update over this transport get it over `fallback` at once."""
    one_at_a_time: ClassVar[bool] = False
    """Updates never overlap: one is prepared only once every replica of the last answered
    (the transport shares memory the replicas read)."""

    def __init__(self, addresses: list[str], config: BroadcastConfig, client: ClientOptions):
        super().__init__(addresses, config, client)
        self._updating = asyncio.Lock()

    @abstractmethod
    async def prepare(
        self, tensors: dict[str, torch.Tensor], version: int, rollback: bool, targets: list[str]
    ) -> Update:
        """Once per update, before any replica gets it."""

    @abstractmethod
    async def send(self, address: str, update: Update) -> None:
        """The update to one replica: returns once it answered, raises grpc.aio.AioRpcError
        (UNAVAILABLE is retried) or any other error (reported for that replica)."""

    def discard(self, update: Update) -> None:
        """Called after an update a replica it was sent to failed (what the transport shared
        may still be in use, or be broken)."""

    async def send_all(self, update: Update, addresses: list[str]) -> dict[str, tuple[str, float]]:
        """Per replica, (its error or "", seconds): every replica at once, each on its own."""
        outcomes = await asyncio.gather(*(self._send_one(a, update) for a in addresses))
        return dict(zip(addresses, outcomes, strict=True))

    async def _send_one(self, address: str, update: Update) -> tuple[str, float]:
        started = time.perf_counter()
        try:
            _, error = await retry_unavailable(
                address, lambda: self.send(address, update), self.config.retries
            )
        except Exception as failure:  # reported per replica, never raised: the others go on
            error = f"{type(failure).__name__}: {failure}"
        return error, time.perf_counter() - (update.started or started)

    async def broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        to: Sequence[str] | None = None,
        rollback: bool = False,
    ) -> list[BroadcastResult]:
        targets = self.targets(to)
        if not targets:
            return []
        async with self._updating if self.one_at_a_time else contextlib.nullcontext():
            results = await self._update(tensors, version, rollback, targets)
        if self.fallback is not None and any(not r.ok for r in results.values()):
            results.update(await self._fall_back(tensors, version, rollback, results))
        return [results[a] for a in targets]

    async def _update(
        self, tensors: dict[str, torch.Tensor], version: int, rollback: bool, targets: list[str]
    ) -> dict[str, BroadcastResult]:
        update = await self.prepare(tensors, version, rollback, targets)
        results = {
            a: BroadcastResult(a, ok=False, error=f"not reachable: {e}", transport=self.transport)
            for a, e in update.left_out.items()
        }
        sent = [a for a in targets if a not in update.left_out]
        outcomes = await self.send_all(update, sent) if sent else {}
        for address, (error, seconds) in outcomes.items():
            if error:
                log.error("weight update to %s over %s failed: %s", address, self.transport, error)
            results[address] = BroadcastResult(
                address,
                ok=not error,
                error=error,
                seconds=seconds,
                bytes=0 if error else update.total_bytes,
                transport=self.transport,
            )
        if any(error for error, _ in outcomes.values()):
            self.discard(update)
        return results

    async def _fall_back(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        rollback: bool,
        results: dict[str, BroadcastResult],
    ) -> dict[str, BroadcastResult]:
        """The update again over `fallback` to the replicas that failed this transport (what
        they report can be wrong: a GPU they cannot map, a network NCCL cannot cross)."""
        assert self.fallback is not None
        failed = [a for a, r in results.items() if not r.ok]
        for address in failed:
            log.warning(
                "replica %s failed a %s update (%s); sending it over %s",
                address,
                self.transport,
                results[address].error,
                self.fallback.transport,
            )
        again = await self.fallback.broadcast(tensors, version, failed, rollback)
        return {r.address: r for r in again}

    async def update_weights(
        self, address: str, header: WeightUpdateHeader, chunks: Iterator[WeightChunk] = iter(())
    ) -> None:
        """One UpdateWeights call: the header, then `chunks` (grpc only), cut as they go out."""
        weights_applied_from_proto(
            await self.stub(address).UpdateWeights(
                update_messages(header, chunks), timeout=self.config.timeout_s
            )
        )


# ---- the receiving half -------------------------------------------------------------------


class WeightSource(Protocol):
    """An update the core fetches itself (`torch_core.ApplyWeights`)."""

    def open(self) -> Mapping[str, torch.Tensor]:
        """Every tensor of the model, checked against it; raises RequestError having
        written nothing."""
        ...

    def copied(self) -> None:
        """Called once the copy into the parameters is issued: returns when the source's
        memory may be written again (the sender reuses it once the replica answers)."""
        ...


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Opened:
    """One update's tensors, ready for the core to copy."""

    def __init__(
        self, open_tensors: Callable[[], Mapping[str, torch.Tensor]], devices: tuple[torch.device, ...]
    ):
        self._open = open_tensors
        self._devices = devices

    def open(self) -> Mapping[str, torch.Tensor]:
        return self._open()

    def copied(self) -> None:
        for device in self._devices:
            synchronize(device)
