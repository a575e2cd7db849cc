"""AdamW and the learning-rate schedule.

The schedule advances once per trained batch (a trainer step), not per optimizer step:
`grad_steps_per_batch` optimizer steps over one batch share that batch's learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlrun.common.config.trainer import ScheduleConfig, TrainerConfig


@dataclass(frozen=True)
class LRFactor:
    """Multiplier of the peak learning rate at a trainer step (0-based): linear warmup over
    `warmup_steps` (reaching the peak at step warmup_steps - 1), then constant, or linear or
    cosine decay to `min_lr_ratio` at `total_steps`."""

    kind: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            shape = 1.0 - progress
        elif self.kind == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            raise ValueError(f"unknown schedule kind {self.kind!r}")
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


def lr_factor(schedule: ScheduleConfig, run_total_steps: int) -> LRFactor:
    """`run_total_steps` is used when `schedule.total_steps` is unset."""
    return LRFactor(
        kind=schedule.kind,
        warmup_steps=schedule.warmup_steps,
        total_steps=schedule.total_steps or run_total_steps,
        min_lr_ratio=schedule.min_lr_ratio,
    )


def build_optimizer(model: torch.nn.Module, config: TrainerConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # On CUDA the fused kernel updates every parameter in a few launches (the default foreach
    # path launches several per parameter group chunk and reads each state tensor more often).
    fused = bool(decay + no_decay) and all(p.device.type == "cuda" for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), fused=fused or None)


def build_scheduler(optimizer: torch.optim.Optimizer, factor: LRFactor) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
