"""torch.distributed for the trainer: the process group from torchrun's environment, FSDP2 or
DDP wrapping, gradient-sync control across micro-batches, sums across ranks, and the command
channel by which rank 0 (the only rank serving gRPC) hands every batch to the other ranks.

FSDP2 `fully_shard` runs on CPU over gloo as well as on GPU over NCCL (checked with torch
2.13), so `parallel = "auto"` means FSDP2 everywhere and CPU tests run the GPU code path; DDP
stays selectable. Both average gradients over ranks, so each rank scales its loss by the world
size to get the gradient of the batch-wide sum.

With `trainer.context_parallel = N`, consecutive groups of N ranks are context groups: the
ranks of one group train the same micro-batches, each its chunk of the sequence (ring
attention, `context_parallel.py`), and the groups share out the batch as data-parallel ranks.
Every token's loss is still on exactly one rank, so the same world-wide gradient average and
loss scale give the gradient of the batch-wide sum, and FSDP2 or DDP runs over all ranks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from rlrun.common.config.trainer import TrainerConfig
from rlrun.common.model import PackedCausal
from rlrun.common.model.transformer import Attend
from rlrun.trainer.context_parallel import RingAttention

ParallelKind = Literal["none", "fsdp", "ddp"]

# Rank 0 waits on gRPC between batches for as long as the orchestrator takes (evals, warm
# start); the other ranks wait on the command channel meanwhile, so it must not time out.
COMMAND_TIMEOUT = timedelta(days=30)


@dataclass(frozen=True)
class Parallelism:
    kind: ParallelKind
    rank: int
    world_size: int
    device: torch.device
    command_group: Any = None
    """A gloo group with a long timeout for the command channel (None on a single process)."""
    context_parallel: int = 1
    """Ranks per context group (`trainer.context_parallel`)."""
    context_group: Any = None
    """This rank's context group (None without context parallelism)."""

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> Parallelism:
        return cls(kind="none", rank=0, world_size=1, device=torch.device(device))

    @property
    def context_rank(self) -> int:
        """Which chunk of each sequence this rank holds."""
        return self.rank % self.context_parallel

    @property
    def data_rank(self) -> int:
        """Which share of the batch this rank's context group trains."""
        return self.rank // self.context_parallel

    @property
    def data_world_size(self) -> int:
        return self.world_size // self.context_parallel

    def attention(self, cu_seqlens: torch.Tensor) -> Attend:
        """The attention context of a planned micro-batch (its CPU `cu_seqlens`)."""
        if self.context_parallel > 1:
            return RingAttention(cu_seqlens, self.context_group, self.device)
        return PackedCausal.from_offsets(cu_seqlens)

    @property
    def loss_scale(self) -> float:
        """Undoes the gradient averaging over ranks, so gradients are of the batch-wide sum."""
        return float(self.world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    @contextlib.contextmanager
    def gradient_sync(self, model: nn.Module, enabled: bool) -> Iterator[None]:
        """Gradients are reduced across ranks only on the last micro-batch of an optimizer step."""
        if self.kind == "ddp" and not enabled:
            with model.no_sync():
                yield
        elif self.kind == "fsdp":
            model.set_requires_gradient_sync(enabled)
            yield
        else:
            yield


def _torchrun_world() -> tuple[int, int, int]:
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def init_parallelism(config: TrainerConfig) -> Parallelism:
    """One process: no process group. Under torchrun: NCCL on GPU, gloo on CPU, plus a gloo
    group for commands."""
    rank, world_size, local_rank = _torchrun_world()
    device = torch.device(config.device)
    context_parallel = config.context_parallel
    if world_size % context_parallel:
        raise ValueError(
            f"trainer.context_parallel = {context_parallel} needs a world size that is a multiple "
            f"of it; this trainer was started with {world_size} rank(s)"
        )
    if world_size == 1:
        return Parallelism.single(device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
    )
    command_group = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    context_group = None
    if context_parallel > 1:
        # Every rank creates every group (new_group is collective); it keeps its own.
        for first in range(0, world_size, context_parallel):
            group = dist.new_group(list(range(first, first + context_parallel)))
            if first <= rank < first + context_parallel:
                context_group = group
    kind: ParallelKind = "ddp" if config.parallel == "ddp" else "fsdp"
    return Parallelism(
        kind=kind,
        rank=rank,
        world_size=world_size,
        device=device,
        command_group=command_group,
        context_parallel=context_parallel,
        context_group=context_group,
    )


def wrap_model(model: nn.Module, parallel: Parallelism) -> nn.Module:
    """FSDP2 shards each decoder layer and then the root (embeddings, final norm, lm_head);
    DDP replicates. Parameter names are unchanged for the state-dict APIs either way."""
    if parallel.kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(parallel.device.type, (parallel.world_size,))
        for layer in model.decoder_layers():
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if parallel.kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [parallel.device.index] if parallel.device.type == "cuda" else None
        # Buffers (rotary frequencies) are deterministic; broadcasting them every forward is waste.
        return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
    return model


class CommandChannel:
    """Rank 0 broadcasts each command object; the other ranks block receiving it."""

    def __init__(self, parallel: Parallelism):
        if parallel.world_size < 2:
            raise ValueError("a command channel needs at least two ranks")
        self.group = parallel.command_group

    def send(self, command: object) -> None:
        dist.broadcast_object_list([command], src=0, group=self.group)

    def receive(self) -> object:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def shutdown(parallel: Parallelism) -> None:
    if parallel.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
