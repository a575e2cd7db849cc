"""The process groups the collective transport's updates travel over, joined the same way by
the trainer (rank 0) and the replicas (the torch engine's core, the vLLM workers).

By backend (the header's `nccl.backend`: both sides must build the same kind of group):
- "pynccl": vLLM's `StatelessProcessGroup` and `PyNcclCommunicator` (what the vLLM workers
  use; the trainer then needs the `vllm` extra);
- "nccl": a standalone `torch.distributed.ProcessGroupNCCL` over the rendezvous TCPStore the
  trainer hosts (the torch engine's replicas);
- "gloo": a standalone `ProcessGroupGloo` over the same store, which runs the very same
  protocol on CPU tensors (tests, no GPU needed).
The torch groups are built from their store, never through `init_process_group`: the
trainer's own default group (FSDP, DDP) is left alone.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist


class WeightGroup(Protocol):
    def broadcast(self, tensor: torch.Tensor) -> None:
        """From rank 0 into `tensor` on every other rank, in place."""
        ...


NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def _nccl_group(store: dist.Store, rank: int, world_size: int, timeout: timedelta):
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    # torch's default (3, SkipCleanUp) takes the whole process down when a collective times
    # out; a failed weight transfer must fail that one update instead (2, CleanUpOnly: the
    # communicator is aborted and wait() raises). The constructor reads it; a value the
    # operator set is kept.
    unset = NCCL_ERROR_HANDLING not in os.environ
    if unset:
        os.environ[NCCL_ERROR_HANDLING] = "2"
    try:
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    finally:
        if unset:
            del os.environ[NCCL_ERROR_HANDLING]


JOINED_KEY = "rlrun/joined"
"""Counts the receivers connected to the rendezvous store of a torch weight group."""

JOIN_POLL_S = 0.02


def _wait_for_receivers(
    store: dist.TCPStore, receivers: int, timeout: timedelta, abort: threading.Event
) -> None:
    """Until every receiver has connected, or `abort` is set (a replica refused the update and
    will never join: the trainer must not wait out the whole timeout for it)."""
    deadline = time.monotonic() + timeout.total_seconds()
    while (joined := store.add(JOINED_KEY, 0)) < receivers:
        if abort.is_set():
            raise RuntimeError(f"a replica refused the update ({joined} of {receivers} receivers joined)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{joined} of {receivers} receivers joined the weight group within {timeout}")
        time.sleep(JOIN_POLL_S)


class _TorchGroup:
    """A torch.distributed group of its own over the rendezvous store."""

    def __init__(
        self,
        backend: str,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout: timedelta,
        abort: threading.Event,
    ):
        # The rendezvous: the trainer (rank 0) hosts the store and waits for every receiver to
        # connect and count itself in.
        self.store = dist.TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
        )
        if rank == 0:
            _wait_for_receivers(self.store, world_size - 1, timeout, abort)
        else:
            self.store.add(JOINED_KEY, 1)
        # Any: torch's stubs give the backend classes no `broadcast`, which they have at run time.
        self.group: Any
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        else:
            torch.cuda.set_device(device)
            self.group = _nccl_group(self.store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast([tensor], dist.BroadcastOptions()).wait()


class _PyNcclGroup:
    def __init__(self, host: str, port: int, rank: int, world_size: int, device: torch.device):
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.device = device
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self.communicator = PyNcclCommunicator(group, device=device)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.communicator.broadcast(tensor, src=0, stream=torch.cuda.current_stream(self.device))


def join_weight_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    device: torch.device,
    timeout: timedelta,
    abort: threading.Event | None = None,
) -> WeightGroup:
    """Blocks until every rank of the group has joined. `abort` (rank 0 of a torch group):
    set when a receiver will not join; the wait then fails at once."""
    if backend in ("gloo", "nccl"):
        return _TorchGroup(backend, host, port, rank, world_size, device, timeout, abort or threading.Event())
    if backend == "pynccl":
        return _PyNcclGroup(host, port, rank, world_size, device)
    raise ValueError(f"unknown weight-broadcast backend {backend!r}")
