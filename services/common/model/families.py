"""Which module tree a config builds: one module per model family."""

from __future__ import annotations

from rlrun.common.model.arch import ArchConfig
from rlrun.common.model.gpt2 import GPT2LMHeadModel
from rlrun.common.model.llama import LlamaForCausalLM
from rlrun.common.model.transformer import CausalLM

FAMILIES: dict[str, type[CausalLM]] = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}


def create_model(arch: ArchConfig) -> CausalLM:
    """An uninitialised model of the config's family (parameters hold whatever torch put there)."""
    return FAMILIES[arch.family](arch)
