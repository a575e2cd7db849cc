"""[inference]: the generation service (torch on CPU, vLLM on GPUs)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

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

    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """How the torch engine runs its decode steps (those without prompts): `on` at static
    shapes, replayed from CUDA graphs captured per bucket of batch size and cached length on
    first use; `off` eagerly at each batch's own shapes; `auto` is `on` when `device` is a
    CUDA device and `off` otherwise. `on` needs a CUDA device. Default: auto."""

    cuda_graph_batch_sizes: list[int] = []
    """Batch-size buckets of the CUDA graphs, each from 1 to `max_batch_size` (which is always
    one). A step runs as the smallest bucket above its highest KV-cache slot. Empty: 1, 2, 4,
    8, then steps of a quarter of the power of two below (10, 12, 14, 16, 20, 24, ...).
    Default: empty."""

    addresses: list[str] = []
    """gRPC host:port of every replica serving the live policy. Filled in by `rlrun local` and
    the operator; set it only to use replicas started by hand. Default: empty."""

    http_addresses: list[str] = []
    """HTTP base URL (`http://host:port`) of each replica in `addresses` that serves the HTTP
    API, in the same order; the plans hand them to env-servers (a verifiers env generates over
    HTTP). Filled in by `rlrun local` when an env needs it. Default: empty."""

    max_batch_size: int = Field(32, ge=1)
    """Most sequences decoded together (continuous batching); more requests wait. Default: 32."""

    max_waiting: int = Field(4096, ge=1)
    """Most queued sequences; beyond this Generate returns RESOURCE_EXHAUSTED. Default: 4096."""

    num_threads: int = Field(1, ge=1)
    """torch intra-op threads of the service process. Default: 1."""

    tool_call_parser: str = "auto"
    """The format chat answers write tool calls in, read out of them into `tool_calls` by the
    OpenAI-compatible API: `hermes`, `qwen3_coder` (Qwen3-Coder's XML), `llama3_json`,
    `mistral`, an installed parser (entry point group `rlrun.tool_parsers`), or `auto`: the
    one the tokenizer's chat template teaches (Hermes for a tokenizer without one, whose tools
    prompt is rlrun's own). Default: auto."""

    http_port: int | None = Field(None, ge=0, le=65535)
    """Port of the OpenAI-compatible HTTP server (0 = OS-assigned). Default: unset (off)."""

    api_key_file: Path | None = None
    """File holding the API key of the OpenAI-compatible HTTP server: every request must carry
    `Authorization: Bearer <key>` (as vLLM's `--api-key`), except /health and /metrics, which
    stay open to probes and scrapes. The operator sets it to the run's generated key (the
    Secret `<run>-auth`, key `api-key`). Default: unset, i.e. the gRPC bearer token
    (`grpc.auth_token_file`) when there is one (one credential for every port), else no key."""

    http_tls_cert: Path | None = None
    """PEM certificate of the HTTP server; with `http_tls_key` it serves HTTPS. The operator
    sets both from spec.secrets.tls. Default: unset, i.e. the gRPC port's (`grpc.tls.cert`)
    when it has TLS (TLS on one port means TLS on the other), else plain HTTP."""

    http_tls_key: Path | None = None
    """PEM private key for `http_tls_cert`. Default: unset."""

    vllm: VllmConfig = VllmConfig()
    """vLLM engine settings (ignored by the torch engine)."""

    @model_validator(mode="after")
    def _cuda_graphs(self) -> InferenceConfig:
        if self.cuda_graphs == "on" and self.device.partition(":")[0] != "cuda":
            raise ValueError(
                f"inference.cuda_graphs = 'on' needs a CUDA inference.device, not {self.device!r}"
            )
        if any(not 1 <= size <= self.max_batch_size for size in self.cuda_graph_batch_sizes):
            raise ValueError(
                f"inference.cuda_graph_batch_sizes must lie in 1 .. inference.max_batch_size "
                f"({self.max_batch_size}), got {self.cuda_graph_batch_sizes}"
            )
        return self

    @model_validator(mode="after")
    def _http_tls_pair(self) -> InferenceConfig:
        if (self.http_tls_cert is None) != (self.http_tls_key is None):
            raise ValueError("inference.http_tls_cert and inference.http_tls_key must be set together")
        return self
