"""The policy model shared by inference and trainer: architecture, attention contexts, loading."""

from rlrun.common.model.arch import ArchConfig
from rlrun.common.model.attention import CachedStep, PackedCausal, SlotKVCache
from rlrun.common.model.families import FAMILIES, create_model
from rlrun.common.model.load import arch_dict, build_model, load_checkpoint_dir, save_checkpoint_dir
from rlrun.common.model.transformer import CausalLM, InitScheme

__all__ = [
    "ArchConfig",
    "CachedStep",
    "CausalLM",
    "FAMILIES",
    "InitScheme",
    "PackedCausal",
    "SlotKVCache",
    "arch_dict",
    "build_model",
    "create_model",
    "load_checkpoint_dir",
    "save_checkpoint_dir",
]
