"""[trainer]: loss, optimizer, packing, checkpoints and weight broadcast."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlrun.common.config.base import Section

ALL_LINEAR = "all-linear"
"""`trainer.lora.target_modules` for every linear layer of the decoder layers (PEFT's word)."""


class LossConfig(Section):
    high: float = Field(0.2, ge=0)
    """With A > 0, tokens where π − μ > high are masked (the side that would amplify). Default: 0.2."""

    low: float = Field(0.2, ge=0)
    """With A ≤ 0, tokens where π − μ < −low are masked. Default: 0.2."""

    kl_coef: float = Field(1e-3, ge=0)
    """Weight of the (log r)^2 penalty that keeps π near μ. Default: 1e-3."""

    entropy_coef: float = Field(0.0, ge=0)
    """Weight of an entropy bonus on rl tokens (−coef · H(π) per token). It keeps a policy
    from collapsing onto one wrong answer, where every sample of a group is the same and
    GRPO's advantages vanish. Default: 0 (off)."""


class ScheduleConfig(Section):
    kind: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warmup. Default: constant."""

    warmup_steps: int = Field(0, ge=0)
    """Linear warmup steps from 0 to `trainer.lr`. Default: 0."""

    total_steps: int | None = Field(None, gt=0)
    """Steps over which linear/cosine decay to `min_lr_ratio`; unset means the run's total
    (warm start plus orchestrator.max_steps). Default: unset."""

    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Final learning rate as a fraction of `trainer.lr`. Default: 0."""


class CheckpointConfig(Section):
    interval: int = Field(10, ge=0)
    """Save every this many steps (0 = no step interval). The orchestrator's state sent with
    the step's batch is saved with it, so any checkpoint resumes the whole run. The state is
    copied while training waits; the files are written while it goes on. A run also saves
    one at step 0, on SIGTERM/SIGINT and at its end. Default: 10."""

    interval_s: float = Field(600.0, ge=0)
    """Also save after a step once this many seconds passed since the last save (0 = no time
    interval): the work a crash can cost stays bounded when steps are slow. Default: 600."""

    keep: int = Field(2, ge=1)
    """Keep the newest this many checkpoints. Default: 2."""


class BroadcastConfig(Section):
    transport: Literal["grpc", "ipc", "nccl", "auto"] = "auto"
    """How weights reach inference (docs/weight-sync.md): "grpc", the chunk stream (works
    everywhere); "ipc", replicas on the trainer's node read the trainer's staging buffer (CUDA
    IPC on a GPU, shared memory on CPU; torch engine only); "nccl", a collective (vLLM's
    communicator for the vllm engine, a torch.distributed group for the torch engine: NCCL
    from a CUDA trainer, gloo from a CPU one); "auto", gRPC from a CPU trainer, else per
    replica: IPC on the trainer's node, NCCL elsewhere, gRPC where neither works (so a CPU
    run is on gRPC and a GPU run takes the fastest path its replicas offer). Default: auto."""

    chunk_mb: float = Field(4.0, gt=0, le=4.0)
    """Chunk size of the weight stream in MiB (at most 4). Default: 4."""

    retries: int = Field(3, ge=0)
    """Retries per replica on UNAVAILABLE before it is reported down. Default: 3."""

    timeout_s: float = Field(120.0, gt=0)
    """Deadline of one replica's update (and of the NCCL collective; an IPC update's replica
    answers once it has copied the weights). The watchdog of a broadcast: a replica that stalls
    (alive but not answering: stopped, a hung device) ends its update at this deadline, with a
    warning naming it, while the others get theirs; it is left out of the next broadcasts and
    re-synced once it answers again (`resync_interval_s`). Default: 120."""

    resync_interval_s: float = Field(2.0, gt=0)
    """How often the trainer asks every replica for its policy version. A replica behind it
    (restarted, or back after it failed a broadcast) gets the current weights right away,
    not at the next step; one that failed a broadcast is left out of the broadcasts until it
    answers again. Default: 2."""

    nccl_host: str = ""
    """Host the replicas reach the trainer's NCCL rendezvous store at (transport = nccl or auto); empty
    means the host part of `trainer.address`, else this machine's host name. Default: empty."""

    nccl_port: int = Field(0, ge=0, le=65535)
    """Port of the NCCL rendezvous store (0 = OS-assigned). Default: 0."""


class OptimizerConfig(Section):
    offload: Literal["none", "cpu"] = "none"
    """Where AdamW's state (two moments per parameter, twice the parameters' own memory) lives:
    `none` on the trainer's device; `cpu` in host memory, where each step runs (the gradients
    are copied to the host, the parameters updated there and copied back), so that a trainer
    holds a larger model at the cost of two transfers of the parameters per step. The step is
    AdamW's own either way. With FSDP over several ranks it is refused (FSDP2's own offload
    policy moves the parameters too). Default: none."""


class LoraConfig(Section):
    """Low-rank adapters (LoRA) on the model's linear layers; the base weights stay frozen,
    and only what trains (the adapters, and the embeddings or head when asked) is optimized,
    checkpointed and sent to inference. The torch engine builds the same adapters from this
    table and serves them unmerged (rlrun.common.model.lora)."""

    rank: int = Field(8, gt=0)
    """Rank r of each adapter (A is [r, in], B is [out, r]). Default: 8."""

    alpha: float = Field(16.0, gt=0)
    """The update B·A is scaled by alpha / rank. Default: 16."""

    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on an adapter's input while training (as PEFT's lora_dropout). Above 0 the
    policy that trains is not the one that sampled (inference never drops), which the
    importance ratio then sees as mismatch. Default: 0."""

    target_modules: list[str] | Literal["all-linear"] = ALL_LINEAR
    """Which linear layers get adapters: "all-linear" (every linear layer of the decoder
    layers, not the head), or a list of patterns, each matching a layer by its last name
    parts (`q_proj`, `self_attn.o_proj`), its fully qualified name
    (`model.layers.0.mlp.down_proj`) or a glob over that name (`model.layers.1.*`). A
    pattern that matches no linear layer of the model is an error. Default: all-linear."""

    train_embeddings: bool = False
    """The embeddings (token, and GPT-2's positions) train too, in full. Default: false."""

    train_head: bool = False
    """The output head trains too, in full. A model that ties its head to its token
    embedding needs this equal to `train_embeddings`. Default: false."""

    @field_validator("target_modules")
    @classmethod
    def _patterns(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list):
            if not value:
                raise ValueError('name at least one pattern, or "all-linear"')
            blank = [i for i, pattern in enumerate(value) if not pattern.strip()]
            if blank:
                raise ValueError(f"pattern {blank[0]} is empty")
            if len(set(value)) != len(value):
                raise ValueError("a pattern is named twice")
        return value


class TrainerConfig(Section):
    address: str = ""
    """gRPC host:port of the trainer (rank 0). Filled in by `rlrun local` and the operator.
    Default: empty."""

    device: str = "cpu"
    """Torch device. Default: cpu."""

    num_threads: int = Field(1, ge=1)
    """torch intra-op threads per process. Default: 1."""

    seed: int = 0
    """Seed for the trainer's RNGs. Default: 0."""

    lr: float = Field(1e-3, gt=0)
    """Peak AdamW learning rate. Default: 1e-3."""

    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay. Default: 0."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas. Default: [0.9, 0.999]."""

    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient clipping norm. Default: 1.0."""

    schedule: ScheduleConfig = ScheduleConfig()
    """Learning-rate schedule."""

    optimizer: OptimizerConfig = OptimizerConfig()
    """Where the optimizer's state lives."""

    grad_steps_per_batch: int = Field(1, ge=1)
    """Optimizer steps per submitted batch (each over the whole batch). Default: 1."""

    micro_batch_tokens: int = Field(4096, gt=0)
    """Packing capacity: most tokens in one micro-batch (seq_len). Default: 4096."""

    loss: LossConfig = LossConfig()
    """The rl-channel loss settings."""

    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoint cadence and retention."""

    broadcast: BroadcastConfig = BroadcastConfig()
    """Weight broadcast to inference replicas."""

    lora: LoraConfig | None = None
    """Train low-rank adapters instead of the whole model (`[trainer.lora]`). Default:
    absent (full fine-tuning)."""

    parallel: Literal["auto", "fsdp", "ddp"] = "auto"
    """Data parallelism when launched with several ranks (torchrun): FSDP2 `fully_shard` or DDP.
    auto means FSDP2 on every device: it runs on CPU over gloo too (checked with torch 2.13), so
    CPU tests exercise the GPU code path. Default: auto."""

    context_parallel: int = Field(1, ge=1)
    """Ranks that share one packed micro-batch, split along the sequence, with ring attention
    between them (docs/parallelism.md): a sample may then be longer than one rank holds.
    `micro_batch_tokens` stays the whole packed sequence's capacity; each rank holds
    ceil(micro_batch_tokens / context_parallel) tokens of it (a sequence is padded to a
    multiple of context_parallel). The world size must be a multiple of it: consecutive
    ranks form a context group, and the groups share out the batch as data-parallel ranks do,
    under `parallel` (FSDP2 or DDP over all ranks). Default: 1 (off)."""
