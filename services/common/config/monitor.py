"""`[monitor]`: experiment tracking of the run's metrics (every metrics.jsonl line) and of
sample rollouts in Weights & Biases and/or TensorBoard, written by the orchestrator. Off by
default; each sink needs the `monitor` extra (`pip install 'rlrun[monitor]'`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rlrun.common.config.base import Section


class WandbConfig(Section):
    enabled: bool = False
    """Log to Weights & Biases. Default: false."""

    project: str = "rlrun"
    """W&B project. Default: rlrun."""

    entity: str | None = None
    """W&B entity (user or team). Default: your default entity."""

    mode: Literal["online", "offline", "disabled"] | None = None
    """`offline` writes the run to `dir` only (upload it later with `wandb sync`). Default: the
    WANDB_MODE environment variable, else online."""

    dir: Path | None = None
    """Folder W&B writes its `wandb/` run folders into. Default: the run's output folder."""

    tags: list[str] = Field(default_factory=list)
    """Tags of the W&B run. Default: none."""


class TensorBoardConfig(Section):
    enabled: bool = False
    """Write TensorBoard event files. Default: false."""

    log_dir: Path | None = None
    """Folder of the event files. Default: `<output folder>/tensorboard`."""


class MonitorConfig(Section):
    wandb: WandbConfig = WandbConfig()
    """Weights & Biases."""

    tensorboard: TensorBoardConfig = TensorBoardConfig()
    """TensorBoard."""

    samples_interval: int = Field(default=10, ge=0)
    """Every this many RL steps, a table of sample rollouts (prompt, completion, reward) goes to
    each enabled sink; 0 = never. Default: 10."""

    num_samples: int = Field(default=8, ge=1)
    """Rollouts in each sample table (the first ones of the batch). Default: 8."""

    @property
    def enabled(self) -> bool:
        return self.wandb.enabled or self.tensorboard.enabled
