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
   dtype and shape; workers load them as they arrive (vLLM's in-place `reload_weights`,
   or the model's `load_weights` on older vLLM).
5. UpdateWeights returns once every tensor is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch


def tensors_from_payload(payload: list[tuple[str, str, list[int], bytes]]) -> list[tuple[str, torch.Tensor]]:
    """The inverse of `vllm_engine.tensor_payload`: (name, tensor) pairs on the CPU."""
    return [
        (name, torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape))
        for name, dtype, shape, data in payload
    ]


class RlrunWorkerExtension:
    """`self` is a vLLM GPU worker: it has `device` and `model_runner`."""

    def _rlrun_load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # reload_weights (recent vLLM) restores each layer's loader and re-runs its
        # post-load processing (repacking, quantization), which plain load_weights cannot
        # do once a backend has replaced the parameters; older vLLM only has load_weights.
        if hasattr(self.model_runner, "reload_weights"):
            self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=weights)

    def rlrun_load_weights(self, payload: list[tuple[str, str, list[int], bytes]]) -> None:
        """Loads Hugging Face-named tensors received over gRPC (see `tensors_from_payload`)."""
        self._rlrun_load([(name, tensor.to(self.device)) for name, tensor in tensors_from_payload(payload)])

    def rlrun_join_weight_group(self, host: str, port: int, world_size: int, first_rank: int) -> None:
        """Joins as the trainer does (`join_weight_group`, backend "pynccl"): the collective
        transport's receiving half for vLLM (rlrun.common.weights.collective)."""
        from vllm.distributed.parallel_state import get_world_group

        from rlrun.common.weights.collective import COLLECTIVE_TIMEOUT_S
        from rlrun.common.weights.groups import join_weight_group

        rank = first_rank + get_world_group().rank
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        self.rlrun_weight_group = join_weight_group(
            "pynccl", host, port, rank, world_size, self.device, timeout
        )

    def rlrun_receive_weights(self, specs: list[tuple[str, str, list[int]]]) -> None:
        """Receives each announced tensor from rank 0 of the weight group, in header order,
        and loads them as they arrive."""
        group = self.rlrun_weight_group

        def received() -> Iterator[tuple[str, torch.Tensor]]:
            for name, dtype, shape in specs:
                buffer = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                group.broadcast(buffer)
                yield name, buffer

        self._rlrun_load(received())
        torch.cuda.synchronize(self.device)
