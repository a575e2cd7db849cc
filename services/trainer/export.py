"""`rlrun export CHECKPOINT`: a LoRA run's checkpoint as a PEFT adapter, and optionally the
merged model as a Hugging Face checkpoint.

    OUT/adapter/   adapter_config.json + adapter_model.safetensors: `peft.PeftModel.from_pretrained`
                   loads it onto the base model (the checkpoint keeps it in this format already)
    OUT/merged/    with --merged: config.json + model.safetensors, the base with every adapter
                   folded in (W + alpha / r · B A); the base is the run file's `[model]`

A checkpoint of full fine-tuning has no adapter: its `model/` folder is the HF checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlrun.common.config import RunConfig
from rlrun.common.model import arch_dict, build_model, save_checkpoint_dir
from rlrun.common.model.lora import from_peft_state, merge_lora
from rlrun.trainer.checkpoint import ADAPTER, ADAPTER_WEIGHTS, verify_checkpoint


class ExportError(ValueError):
    """A checkpoint that cannot be exported as asked."""


def export_checkpoint(checkpoint: Path, out: Path, config: RunConfig | None = None) -> list[Path]:
    """Writes OUT/adapter, and with `config` (the run's file) OUT/merged; returns the folders
    written. Raises ExportError, or CorruptCheckpoint for a checkpoint that does not verify."""
    verify_checkpoint(checkpoint)
    adapter = checkpoint / ADAPTER
    if not adapter.is_dir():
        raise ExportError(
            f"{checkpoint} is not of a LoRA run (no {ADAPTER}/): its model/ folder is already a "
            "Hugging Face checkpoint"
        )
    written = [out / ADAPTER]
    shutil.copytree(adapter, written[0], dirs_exist_ok=True)
    if config is not None:
        written.append(export_merged(adapter, config, out / "merged"))
    return written


def export_merged(adapter: Path, config: RunConfig, out: Path) -> Path:
    from safetensors.torch import load_file

    if config.trainer.lora is None:
        raise ExportError("the run file has no [trainer.lora]: it does not say how the adapter was built")
    model = build_model(config.model, lora=config.trainer.lora)
    trained = from_peft_state(load_file(str(adapter / ADAPTER_WEIGHTS)))
    if set(trained) != model.trained:
        raise ExportError(
            f"the adapter in {adapter} does not fit the run file's [model] and [trainer.lora]: "
            f"missing {sorted((model.trained or set()) - set(trained))[:5]}, "
            f"unexpected {sorted(set(trained) - (model.trained or set()))[:5]}"
        )
    model.load_state_dict(trained, strict=False)
    return save_checkpoint_dir(merge_lora(model), arch_dict(config.model), out)
