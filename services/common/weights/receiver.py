"""The torch engine's receiving end of the fetched transports: what it tells the trainer it
takes (`torch_sync_info`), and the one receiver, in the process that holds the parameters,
that opens both kinds of source (`WeightReceiver`)."""

from __future__ import annotations

import torch

from rlrun.common.weights.collective import CollectiveReceiver, CollectiveSource
from rlrun.common.weights.ipc import IpcReceiver, IpcSource
from rlrun.common.weights.protocol import WeightSource, node_id
from rlrun.common.wire.weights import Backend, WeightSyncInfo


def torch_sync_info(device: torch.device) -> WeightSyncInfo:
    """What a torch-engine replica on `device` accepts."""
    backends: list[Backend] = ["gloo", "nccl"] if device.type == "cuda" else ["gloo"]
    return WeightSyncInfo(node_id(), str(device), ["grpc", "ipc", "nccl"], backends)


class WeightReceiver:
    """Opens IPC buffers and joins weight groups on `device`, and keeps both for the next update."""

    def __init__(self, device: torch.device):
        self.device = device
        self.ipc = IpcReceiver(device)
        self.collective = CollectiveReceiver(device)

    def source(self, source: IpcSource | CollectiveSource) -> WeightSource:
        if isinstance(source, IpcSource):
            return self.ipc.source(source)
        return self.collective.source(source)
