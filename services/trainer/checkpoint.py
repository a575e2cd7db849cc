"""Trainer checkpoints on disk: `<run_dir>/checkpoints/step_<N>/`.

    model/                 Hugging Face layout (config.json + model.safetensors): servable as is
    trainer_state.pt       optimizer, LR scheduler and RNG states
    extra_state.bin        opaque bytes from SaveCheckpointRequest (the orchestrator's state)
    meta.json              step, policy version, world size

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash never
leaves a half-written `step_<N>`; only the newest `keep` are kept. Tensors are full (unsharded)
and keyed by Hugging Face names, so any world size can resume any checkpoint. The LR schedule
resumes as saved (LambdaLR keeps its LRFactor's fields), whatever the config says now.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlrun.trainer.learner import LearnerState

PREFIX = "step_"
META = "meta.json"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _step_of(path: Path) -> int | None:
    suffix = path.name.removeprefix(PREFIX)
    if path.name.startswith(PREFIX) and suffix.isdigit() and (path / META).exists():
        return int(suffix)
    return None


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.exists():
        return []
    found = [(step, path) for path in root.iterdir() if (step := _step_of(path)) is not None]
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def resolve_resume(root: Path, spec: str | None) -> Path | None:
    """`--resume`: None (fresh start), `latest` (the newest under root, or a fresh start when
    there is none yet), or a checkpoint folder, which must exist."""
    if spec is None:
        return None
    if spec == "latest":
        return latest_checkpoint(root)
    path = Path(spec)
    if not (path / META).exists():
        raise FileNotFoundError(f"--resume {spec}: {path} is not a checkpoint (no {META})")
    return path


def save_checkpoint(
    root: Path, state: LearnerState, extra_state: bytes, arch: dict, world_size: int, keep: int
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{state.step}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    (tmp / "model").mkdir(parents=True)
    (tmp / "model" / "config.json").write_text(json.dumps(arch, indent=2))
    save_file({k: v.contiguous() for k, v in state.model.items()}, str(tmp / "model" / "model.safetensors"))
    torch.save(
        {"optimizer": state.optimizer, "scheduler": state.scheduler, "rng": state.rng},
        tmp / "trainer_state.pt",
    )
    (tmp / "extra_state.bin").write_bytes(extra_state)
    (tmp / META).write_text(
        json.dumps({"step": state.step, "version": state.version, "world_size": world_size})
    )
    if final.exists():  # a second save at the same step (e.g. interval, then on request)
        stale = root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, stale)
        os.replace(tmp, final)
        shutil.rmtree(stale)
    else:
        os.replace(tmp, final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old)
    return final


def load_checkpoint(path: Path) -> tuple[LearnerState, bytes]:
    meta = json.loads((path / META).read_text())
    # Our own file: it holds Python and numpy RNG states, which weights_only cannot load.
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
    state = LearnerState(
        step=meta["step"],
        version=meta["version"],
        model=load_file(str(path / "model" / "model.safetensors")),
        optimizer=trainer_state["optimizer"],
        scheduler=trainer_state["scheduler"],
        rng=trainer_state["rng"],
    )
    return state, (path / "extra_state.bin").read_bytes()
