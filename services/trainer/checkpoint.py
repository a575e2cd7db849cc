"""Trainer checkpoints on disk: `<run_dir>/checkpoints/step_<N>/`.

    model/                 Hugging Face layout (config.json + model.safetensors): servable as is
    adapter/               instead of model/ under `trainer.lora`: what trains, as a PEFT
                           adapter (adapter_config.json + adapter_model.safetensors); the
                           frozen base is the run's model config, as built
    trainer_state.pt       optimizer, LR scheduler and RNG states
    extra_state.bin        opaque bytes from SaveCheckpointRequest (the orchestrator's state)
    meta.json              step, policy version, world size, and the size and SHA-256 of every
                           other file (written last)

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash never
leaves a half-written `step_<N>`; only the newest `keep` are kept. A checkpoint whose files do
not match its meta.json (a disk that lost or mangled bytes, a copy cut short) is never loaded:
the newest one that verifies is used instead. Tensors are full (unsharded)
and keyed by Hugging Face names, so any world size can resume any checkpoint. The LR schedule
resumes as saved (LambdaLR keeps its LRFactor's fields), whatever the config says now.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlrun.common.model.lora import from_peft_state, peft_state
from rlrun.trainer.learner import LearnerState

PREFIX = "step_"
META = "meta.json"
EXTRA = "extra_state.bin"
ADAPTER = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

log = logging.getLogger(__name__)


class CorruptCheckpoint(ValueError):
    """A checkpoint folder whose files do not match its meta.json."""


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_of(path: Path) -> int | None:
    suffix = path.name.removeprefix(PREFIX)
    if path.name.startswith(PREFIX) and suffix.isdigit() and (path / META).exists():
        return int(suffix)
    return None


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.exists():
        return []
    found = [(step, path) for path in root.iterdir() if (step := step_of(path)) is not None]
    return [path for _, path in sorted(found)]


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
    return sha.hexdigest()


def _file_manifest(folder: Path) -> dict[str, dict[str, int | str]]:
    return {
        str(path.relative_to(folder)): {"bytes": path.stat().st_size, "sha256": _digest(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != META
    }


def verify_checkpoint(path: Path) -> dict:
    """The checkpoint's meta.json once every file it lists has its size and digest; raises
    CorruptCheckpoint naming the first file that does not."""
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as error:
        raise CorruptCheckpoint(f"{path / META}: {error}") from None
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpoint(f"{path / META} lists no files (written by an older rlrun?)")
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"{file} is missing")
        if file.stat().st_size != expected["bytes"]:
            raise CorruptCheckpoint(
                f"{file} has {file.stat().st_size} bytes, meta.json says {expected['bytes']}"
            )
        if _digest(file) != expected["sha256"]:
            raise CorruptCheckpoint(f"{file} does not match its SHA-256 in meta.json")
    return meta


def latest_checkpoint(root: Path, max_step: int | None = None) -> Path | None:
    """The newest checkpoint (at or before `max_step`) that verifies; a corrupt one is
    skipped with a warning naming what is wrong, and the one before it is used."""
    for path in reversed(list_checkpoints(root)):
        step = step_of(path)
        if max_step is not None and step is not None and step > max_step:
            continue
        try:
            verify_checkpoint(path)
        except CorruptCheckpoint as error:
            log.warning("skipping checkpoint %s: %s", path, error)
            continue
        return path
    return None


def discard_after(root: Path, step: int) -> list[Path]:
    """Deletes the checkpoints of steps after `step` (a rollback's abandoned future: those
    steps are trained again, and an old folder must never stand for a new step)."""
    gone = [path for path in list_checkpoints(root) if (step_of(path) or 0) > step]
    for path in gone:
        shutil.rmtree(path)
    return gone


def save_checkpoint(
    root: Path,
    state: LearnerState,
    extra_state: bytes,
    arch: dict,
    world_size: int,
    keep: int,
    adapter: dict | None = None,
) -> Path:
    """`adapter`: the PEFT adapter config of a LoRA run (`Learner.adapter_config`), whose
    state holds only what trains."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{state.step}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tensors = {k: v.contiguous() for k, v in state.model.items()}
    if adapter is None:
        (tmp / "model").mkdir(parents=True)
        (tmp / "model" / "config.json").write_text(json.dumps(arch, indent=2))
        save_file(tensors, str(tmp / "model" / "model.safetensors"))
    else:
        (tmp / ADAPTER).mkdir(parents=True)
        (tmp / ADAPTER / ADAPTER_CONFIG).write_text(json.dumps(adapter, indent=2))
        save_file(peft_state(tensors), str(tmp / ADAPTER / ADAPTER_WEIGHTS))
    torch.save(
        {"optimizer": state.optimizer, "scheduler": state.scheduler, "rng": state.rng},
        tmp / "trainer_state.pt",
    )
    (tmp / EXTRA).write_bytes(extra_state)
    meta = {
        "step": state.step,
        "version": state.version,
        "world_size": world_size,
        "files": _file_manifest(tmp),
    }
    (tmp / META).write_text(json.dumps(meta, indent=1))
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


def read_extra_state(path: Path) -> bytes:
    return (path / EXTRA).read_bytes()


def start_fresh(root: Path) -> bool:
    """`--fresh`: removes every checkpoint under root; True when there were any."""
    found = root.exists() and any(root.iterdir())
    shutil.rmtree(root, ignore_errors=True)
    return found


def load_checkpoint(path: Path) -> tuple[LearnerState, bytes]:
    """Raises CorruptCheckpoint when the folder does not verify."""
    meta = verify_checkpoint(path)
    # Our own file: it holds Python and numpy RNG states, which weights_only cannot load.
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
    adapter = path / ADAPTER / ADAPTER_WEIGHTS
    if adapter.exists():
        model = from_peft_state(load_file(str(adapter)))
    else:
        model = load_file(str(path / "model" / "model.safetensors"))
    state = LearnerState(
        step=meta["step"],
        version=meta["version"],
        model=model,
        optimizer=trainer_state["optimizer"],
        scheduler=trainer_state["scheduler"],
        rng=trainer_state["rng"],
    )
    return state, read_extra_state(path)
