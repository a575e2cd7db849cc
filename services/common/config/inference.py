"""[inference]: the generation service (torch on CPU, vLLM on GPUs)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlrun.common.config.base import Section


class VllmConfig(Section):
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    """Fraction of GPU memory vLLM may use. Default: 0.85."""

    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs per replica for tensor parallelism. Default: 1."""

    enforce_eager: bool = False
    """Disable CUDA graphs (faster start, slower decode). Default: false."""


class InferenceConfig(Section):
    engine: Literal["torch", "vllm"] = "torch"
    """Generation engine: `torch` (CPU or any torch device) or `vllm` (GPU extra). Default: torch."""

    engine_process: bool = True
    """Run the torch engine in a process of its own, so that the gRPC and HTTP front end and
    the decode loop do not share a GIL (on a busy replica that costs the loop a quarter of
    its throughput). Ignored by vLLM, whose engine core has a process of its own.
    Default: true."""

    device: str = "cpu"
    """Torch device for the torch engine. Default: cpu."""

    addresses: list[str] = []
    """gRPC host:port of every replica serving the live policy. Filled in by `rlrun local` and
    the operator; set it only to use replicas started by hand. Default: empty."""

    max_batch_size: int = Field(32, ge=1)
    """Most sequences decoded together (continuous batching); more requests wait. Default: 32."""

    max_waiting: int = Field(4096, ge=1)
    """Most queued sequences; beyond this Generate returns RESOURCE_EXHAUSTED. Default: 4096."""

    num_threads: int = Field(1, ge=1)
    """torch intra-op threads of the service process. Default: 1."""

    http_port: int | None = Field(None, ge=0, le=65535)
    """Port of the OpenAI-compatible HTTP server (0 = OS-assigned). Default: unset (off)."""

    vllm: VllmConfig = VllmConfig()
    """vLLM engine settings (ignored by the torch engine)."""
