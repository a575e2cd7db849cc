"""The policy model shared by inference and trainer: architecture, attention contexts, loading."""

from rlrun.common.model.arch import ArchConfig
from rlrun.common.model.attention import CachedStep, PackedCausal, SlotKVCache
from rlrun.common.model.load import arch_dict, build_model, load_checkpoint_dir, save_checkpoint_dir
from rlrun.common.model.transformer import CausalLM

__all__ = [
    "ArchConfig",
    "CachedStep",
    "CausalLM",
    "PackedCausal",
    "SlotKVCache",
    "arch_dict",
    "build_model",
    "load_checkpoint_dir",
    "save_checkpoint_dir",
]
