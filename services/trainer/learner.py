"""The train step: one TrainingBatch in, `grad_steps_per_batch` optimizer steps, step and
policy version bumped, or, on a non-finite loss or gradient norm, nothing changed at all.

Every rank runs the same `Learner` on the whole batch and trains its own share of the
micro-batches (see packing); under context parallelism the ranks of a context group share a
micro-batch, each its chunk of the sequence. Loss normalizers are batch-wide token counts that
every rank computes from the whole batch; the statistics are summed across ranks.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rlrun.common.config import RunConfig
from rlrun.common.config.trainer import TrainerConfig
from rlrun.common.model import FAMILIES, ArchConfig, build_model
from rlrun.common.model.lora import base_model_name, peft_config
from rlrun.common.model.transformer import Attend
from rlrun.common.wire.trainer import StepResult
from rlrun.common.wire.training import TrainingBatch
from rlrun.trainer.context_parallel import split_micro_batch
from rlrun.trainer.distributed import Parallelism, wrap_model
from rlrun.trainer.loss import STAT_NAMES, channel_loss, summarize, token_logprobs
from rlrun.trainer.optim import build_optimizer, build_scheduler, lr_factor
from rlrun.trainer.packing import (
    ChannelCounts,
    PackedMicroBatch,
    count_channel_tokens,
    plan_rank_micro_batches,
)


@dataclass
class LearnerState:
    """Everything a checkpoint restores, with full (unsharded) tensors keyed by HF names."""

    step: int
    version: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    """None before the first optimizer step (AdamW has no state yet)."""
    scheduler: dict[str, Any]
    rng: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _norm_value(norm: torch.Tensor) -> float:
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


class _Snapshot:
    """Parameters and optimizer state before a batch, restored when a later optimizer step of
    the same batch turns non-finite (the batch must then leave no trace)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        # What trains only: a frozen (LoRA) base cannot change.
        self.trained = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            self.params = [p.detach().clone() for p in self.trained]
        self.state = {
            p: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in optimizer.state.items()
        }

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for param, saved in zip(self.trained, self.params, strict=True):
                param.copy_(saved)
        optimizer.state.clear()
        optimizer.state.update(self.state)


class Learner:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LambdaLR,
        config: TrainerConfig,
        parallel: Parallelism,
        arch: ArchConfig,
        trained: frozenset[str] | None = None,
        adapter_config: dict | None = None,
    ):
        """`trained`: the names of what trains when not the whole model (`CausalLM.trained`);
        `adapter_config`: then (LoRA) the PEFT adapter config its checkpoints are saved with."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.parallel = parallel
        self.arch = arch
        self.trained = trained
        self.adapter_config = adapter_config
        self.step = 0
        self.version = 0

    @property
    def scheduled_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def plan(self, batch: TrainingBatch) -> list[tuple[PackedMicroBatch, Attend]]:
        """This rank's micro-batches of `batch` on its device, each with its attention context:
        its context group's share of the batch, and of each micro-batch its own chunk."""
        parallel = self.parallel
        planned = plan_rank_micro_batches(
            batch.samples, self.config.micro_batch_tokens, parallel.data_world_size, parallel.data_rank
        )
        if parallel.context_parallel > 1:
            planned = [
                split_micro_batch(micro, parallel.context_rank, parallel.context_parallel)
                for micro in planned
            ]
        return [(micro.to(parallel.device), parallel.attention(micro.cu_seqlens)) for micro in planned]

    def accumulate(
        self, micro_batches: list[tuple[PackedMicroBatch, Attend]], counts: ChannelCounts
    ) -> torch.Tensor:
        """Forward and backward over this rank's planned micro-batches, adding to the
        parameters' gradients (reduced across ranks on the last one); returns the
        all-reduced stats."""
        stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64, device=self.parallel.device)
        last = len(micro_batches) - 1
        for index, (micro, attend) in enumerate(micro_batches):
            with self.parallel.gradient_sync(self.model, enabled=index == last):
                logits = self.model(micro.input_ids, micro.positions, attend, micro.predict_rows)
                logprobs, entropy = token_logprobs(
                    logits,
                    micro.targets,
                    micro.temperatures,
                    entropy_grad=self.config.loss.entropy_coef != 0,
                )
                terms = channel_loss(
                    logprobs,
                    entropy,
                    micro.sampling_logprobs,
                    micro.advantages,
                    micro.rl_mask,
                    micro.ce_weights,
                    micro.ce_mask,
                    counts.rl,
                    counts.ce,
                    self.config.loss,
                )
                (terms.loss * self.parallel.loss_scale).backward()
            stats += terms.stats.to(stats.dtype)
        return self.parallel.all_reduce_sum(stats)

    def train(self, batch: TrainingBatch) -> StepResult:
        """Trains on a validated batch whose step is this learner's step."""
        if batch.step != self.step:
            raise ValueError(f"batch.step {batch.step} is not the learner's step {self.step}")
        started = time.perf_counter()
        counts = count_channel_tokens(batch.samples)
        micro_batches = self.plan(batch)
        lr = batch.learning_rate if batch.learning_rate is not None else self.scheduled_lr
        grad_steps = self.config.grad_steps_per_batch
        snapshot = _Snapshot(self.model, self.optimizer) if grad_steps > 1 else None
        metrics: dict[str, float] = {}
        self.model.train()
        for grad_step in range(grad_steps):
            self.optimizer.zero_grad(set_to_none=True)
            stats = self.accumulate(micro_batches, counts)
            grad_norm = _norm_value(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            )
            summary = summarize(stats, counts.rl, counts.ce, counts.trained)
            if not (math.isfinite(summary["loss"]) and math.isfinite(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                self._set_lr(self.scheduled_lr)
                if snapshot is not None and grad_step > 0:
                    snapshot.restore(self.model, self.optimizer)
                what = "loss" if not math.isfinite(summary["loss"]) else "gradient norm"
                return StepResult(
                    step=self.step,
                    version=self.version,
                    skipped=True,
                    skip_reason=f"non-finite {what} at optimizer step {grad_step + 1} of {grad_steps}",
                    metrics={**summary, "grad_norm": grad_norm},
                )
            self._set_lr(lr)
            self.optimizer.step()
            if grad_step == 0:
                # Measured before this batch moved the policy, so mismatch_kl is the gap between
                # the sampling policy and the trainer's (staleness plus numerics).
                metrics = {**summary, "grad_norm": grad_norm}
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()  # back to the schedule, whatever this batch's override was
        self.step += 1
        self.version += 1
        seconds = time.perf_counter() - started
        metrics.update(
            lr=lr,
            tokens=float(counts.total),
            tokens_rl=float(counts.rl),
            tokens_ce=float(counts.ce),
            micro_batches_per_rank=float(len(micro_batches)),
            step_seconds=seconds,
            tokens_per_second=counts.total * grad_steps / seconds,
        )
        return StepResult(step=self.step, version=self.version, skipped=False, metrics=metrics)

    def full_weights(self, on_cpu: bool = True) -> dict[str, torch.Tensor]:
        """What trains, unsharded, by HF name, as a weight update carries it and a checkpoint
        keeps it: the whole model, or under LoRA the adapters (and the embeddings or head
        that train in full), never the frozen base. A tied lm_head is implied. A collective
        under FSDP: every rank must call it; rank 0's result is whole."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=on_cpu, ignore_frozen_params=True)
        state = get_model_state_dict(self.model, options=options)
        if self.arch.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        return state

    def capture_state(self) -> LearnerState:
        """A collective under FSDP, like `full_weights`."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # get_optimizer_state_dict would initialise an empty AdamW state with a zero-lr step,
        # which changes later bias corrections; an untouched optimizer is saved as None.
        optimizer = (
            get_optimizer_state_dict(self.model, self.optimizer, options=options)
            if self.optimizer.state
            else None
        )
        return LearnerState(
            step=self.step,
            version=self.version,
            model=self.full_weights(on_cpu=True),
            optimizer=optimizer,
            scheduler=self.scheduler.state_dict(),
            rng=capture_rng(),
        )

    def restore_state(self, state: LearnerState) -> None:
        # Under LoRA the state holds what trains; the frozen base is the config's, as built.
        if self.trained is not None and set(state.model) != self.trained:
            raise ValueError(
                "the checkpoint does not hold what this run trains: missing "
                f"{sorted(self.trained - set(state.model))[:5]}, unexpected "
                f"{sorted(set(state.model) - self.trained)[:5]} (a checkpoint of another "
                "trainer.lora setting?)"
            )
        options = StateDictOptions(full_state_dict=True, strict=self.trained is None)
        model_state = dict(state.model)
        embedding = FAMILIES[self.arch.family].embedding_key
        if self.arch.tie_word_embeddings and embedding in model_state:
            model_state["lm_head.weight"] = model_state[embedding]
        set_model_state_dict(self.model, model_state, options=options)
        if state.optimizer is not None:
            set_optimizer_state_dict(self.model, self.optimizer, state.optimizer, options=options)
        self.scheduler.load_state_dict(state.scheduler)
        restore_rng(state.rng)
        self.step = state.step
        self.version = state.version


def build_learner(config: RunConfig, parallel: Parallelism) -> Learner:
    """The policy from `config.model` (the same seeded init as inference, so both start at
    version 0 with identical weights), wrapped for `parallel`, with AdamW and the schedule."""
    torch.manual_seed(config.trainer.seed)
    random.seed(config.trainer.seed)
    np.random.seed(config.trainer.seed)
    model = build_model(config.model, device=parallel.device, lora=config.trainer.lora)
    arch, trained = model.config, model.trained
    lora = config.trainer.lora
    adapter = None if lora is None else peft_config(lora, model, base_model_name(config.model))
    model = wrap_model(model, parallel)
    optimizer = build_optimizer(model, config.trainer, shards=parallel.kind == "fsdp")
    run_steps = config.orchestrator.warm_start.max_steps + config.orchestrator.max_steps
    scheduler = build_scheduler(optimizer, lr_factor(config.trainer.schedule, run_steps))
    return Learner(model, optimizer, scheduler, config.trainer, parallel, arch, trained, adapter)
