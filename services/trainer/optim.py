"""AdamW (on the device, or with its state in host memory) and the learning-rate schedule.

The schedule advances once per trained batch (a trainer step), not per optimizer step:
`grad_steps_per_batch` optimizer steps over one batch share that batch's learning rate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

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


HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
"""The group settings an AdamW step reads (the rest say how it runs: foreach, fused, ...)."""


class HostOffloadedAdamW(torch.optim.AdamW):
    """AdamW whose state lives in host memory (`trainer.optimizer.offload = "cpu"`).

    To everything outside (the LR scheduler, the state-dict APIs, checkpoints, the learner's
    snapshot) it is the AdamW of the model's parameters: its param groups hold them and its
    `state` is keyed by them, with the same entries (`step`, `exp_avg`, `exp_avg_sq`), only
    on the host, so a checkpoint loads into either kind. A step copies each parameter and its
    gradient into a host twin (pinned buffers on CUDA, kept across steps), runs a plain AdamW
    over the twins there, whose state is this optimizer's own, and copies the parameters
    back. On a CPU trainer the twins are separate tensors all the same, so the CPU tests run
    the copies a CUDA trainer makes."""

    def __init__(self, params, **settings: Any):
        super().__init__(params, **settings)
        self._twin: dict[torch.Tensor, torch.Tensor] = {}
        """Device parameter -> its host copy, whose `.grad` is the host copy of its gradient."""
        self._host = torch.optim.AdamW(
            [{"params": [], **{k: group[k] for k in HYPERPARAMETERS}} for group in self.param_groups]
        )

    def _host_copy(self, param: torch.Tensor) -> torch.Tensor:
        twin = self._twin.get(param)
        if twin is None:
            pin = param.device.type == "cuda"
            twin = self._twin[param] = torch.empty(param.shape, dtype=param.dtype, pin_memory=pin)
            twin.grad = torch.empty(param.shape, dtype=param.dtype, pin_memory=pin)
        return twin

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("HostOffloadedAdamW.step takes no closure")
        pairs = []
        for group, host_group in zip(self.param_groups, self._host.param_groups, strict=True):
            live = [p for p in group["params"] if p.grad is not None]
            host_group.update({k: group[k] for k in HYPERPARAMETERS})
            host_group["params"] = [self._host_copy(p) for p in live]
            for param, twin in zip(live, host_group["params"], strict=True):
                twin.copy_(param.detach(), non_blocking=True)
                twin.grad.copy_(param.grad, non_blocking=True)
                pairs.append((param, twin))
        if any(param.device.type == "cuda" for param, _ in pairs):
            torch.cuda.synchronize()  # the host step reads what the copies above wrote
        # The host AdamW keeps no state of its own: its state is this one's, by device param.
        self._host.state = defaultdict(dict, {twin: self.state[param] for param, twin in pairs})
        self._host.step()
        for param, twin in pairs:
            param.copy_(twin, non_blocking=True)
        return None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loading puts the state on each parameter's device (torch's rule); it goes back to
        the host."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[key] = value.to("cpu")


def build_optimizer(model: torch.nn.Module, config: TrainerConfig, shards: bool = False) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases), its state on the
    device or (`config.optimizer.offload`) in host memory. `shards`: the parameters are FSDP
    shards, whose state the host copies cannot hold."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optimizer.offload == "cpu":
        if shards:
            raise ValueError(
                'trainer.optimizer.offload = "cpu" does not run with FSDP over several ranks; '
                'set trainer.parallel = "ddp", or leave the optimizer on the device'
            )
        return HostOffloadedAdamW(groups, lr=config.lr, betas=tuple(config.betas))
    # On CUDA the fused kernel updates every parameter in a few launches (the default foreach
    # path launches several per parameter group chunk and reads each state tensor more often).
    fused = bool(decay + no_decay) and all(p.device.type == "cuda" for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), fused=fused or None)


def build_scheduler(optimizer: torch.optim.Optimizer, factor: LRFactor) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
