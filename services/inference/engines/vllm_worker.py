"""Methods mixed into every vLLM GPU worker (`worker_extension_cls`), called by the vLLM
engine through `collective_rpc`. They run inside vLLM's worker processes, between two
scheduler steps, so a weight update never lands in the middle of a decode step.

The NCCL weight broadcast, as the trainer must drive it:
1. The trainer (rank 0) picks host:port for a TCP store and, per inference replica, the
   replica's first rank; world_size = 1 + the sum of every replica's tensor-parallel size.
2. For each update it opens UpdateWeights on every replica and sends only a
   WeightUpdateHeader with transport = WEIGHT_TRANSPORT_NCCL, `nccl` = {host, port,
   world_size, rank (that replica's first rank), group_name} and the tensor list, then
   half-closes the stream.
3. On the first update (or when the rendezvous changes) every worker of the replica joins
   the group as rank + its vLLM world rank (`StatelessProcessGroup` + `PyNcclCommunicator`);
   the trainer joins as rank 0 with the same two classes.
4. The trainer broadcasts each tensor from rank 0, in header order, with the header's
   dtype and shape; workers load each one with the model's own `load_weights`.
5. UpdateWeights returns once every tensor is loaded.
"""

from __future__ import annotations

import torch


class RlrunWorkerExtension:
    """`self` is a vLLM GPU worker: it has `device` and `model_runner.model`."""

    def rlrun_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Loads Hugging Face-named tensors received over gRPC."""
        weights = [(name, tensor.to(self.device, non_blocking=True)) for name, tensor in named_tensors]
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize(self.device)

    def rlrun_join_weight_group(self, host: str, port: int, world_size: int, first_rank: int) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = first_rank + get_world_group().rank
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self.rlrun_weight_group = PyNcclCommunicator(group, device=self.device)

    def rlrun_receive_weights(self, specs: list[tuple[str, str, list[int]]]) -> None:
        """Receives each announced tensor from rank 0 of the weight group and loads it."""
        communicator = self.rlrun_weight_group
        for name, dtype, shape in specs:
            buffer = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            communicator.broadcast(buffer, src=0, stream=torch.cuda.current_stream())
            self.model_runner.model.load_weights(weights=[(name, buffer)])
        torch.cuda.synchronize(self.device)
