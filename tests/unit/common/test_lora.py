"""LoRA on the shared model: `[trainer.lora]` checked early, adapters that start at the base,
target patterns, a frozen base, merging, and the PEFT adapter files read by `peft` itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlrun.checks import Scope, check_run
from rlrun.common.config import ConfigError, LoraConfig, ModelConfig, resolve_config
from rlrun.common.model import PackedCausal, build_model
from rlrun.common.model.lora import (
    LoraLinear,
    from_peft_state,
    lora_targets,
    merge_lora,
    peft_config,
    peft_state,
)
from rlrun.common.weights.protocol import broadcast_tensors

REPO = Path(__file__).resolve().parents[3]
LLAMA = REPO / "configs/models/tiny-d64.json"
GPT2 = REPO / "configs/models/tiny-gpt2-d64.json"
TIED = REPO / "configs/models/tiny-d128.json"


def model_config(config: Path = LLAMA, seed: int = 0) -> ModelConfig:
    vocab = json.loads(config.read_text())["vocab_size"]
    tokenizer = "char" if vocab >= 102 else "lowercase"
    return ModelConfig(config=config, tokenizer=REPO / "configs/tokenizer" / tokenizer, seed=seed)


def run(**lora) -> dict:
    return {
        "model": {"config": str(LLAMA), "tokenizer": str(REPO / "configs/tokenizer/char")},
        "trainer": {"lora": lora},
        "orchestrator": {"train": {"env": [{"id": "reverse-text"}]}},
    }


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        positions = torch.arange(len(tokens))
        return model(tokens, positions, PackedCausal.from_offsets(torch.tensor([0, len(tokens)])))


def perturb(model, seed: int = 5) -> None:
    """Adapters as after some training (B nonzero), drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLinear):
                module.lora_B.weight.copy_(torch.randn(module.lora_B.weight.shape, generator=gen) * 0.1)


TOKENS = torch.tensor([5, 9, 23, 17, 20, 4, 12])


@pytest.mark.parametrize(
    ("lora", "field"),
    [
        ({"rank": 0}, "trainer.lora.rank"),
        ({"alpha": -1}, "trainer.lora.alpha"),
        ({"dropout": 1.0}, "trainer.lora.dropout"),
        ({"target_modules": []}, "trainer.lora.target_modules"),
        ({"target_modules": ["q_proj", "q_proj"]}, "trainer.lora.target_modules"),
        ({"ranke": 4}, "trainer.lora.ranke"),
    ],
)
def test_a_bad_lora_table_names_its_field(lora, field):
    with pytest.raises(ConfigError) as error:
        resolve_config(run(**lora))
    assert error.value.path.startswith(field)


def test_lora_needs_the_torch_engine():
    with pytest.raises(ConfigError, match="trainer.lora needs inference.engine = 'torch'"):
        resolve_config({**run(), "inference": {"engine": "vllm"}})


def test_a_pattern_that_matches_no_layer_is_named_by_check_config():
    config, _ = resolve_config(run(target_modules=["q_proj", "qkv_proj"]))
    with pytest.raises(ConfigError) as error:
        check_run(config, Scope.service("trainer"))
    assert error.value.path == "trainer.lora.target_modules"
    assert "'qkv_proj' matches no linear layer" in str(error.value)
    assert "q_proj" in str(error.value)  # the layers it could have meant
    good, _ = resolve_config(run(target_modules=["q_proj"]))
    check_run(good, Scope.service("trainer"))


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        ("all-linear", 14),  # 7 per decoder layer, never the head
        (["q_proj", "v_proj"], 4),
        (["self_attn.o_proj"], 2),
        (["model.layers.1.mlp.down_proj"], 1),  # fully qualified
        (["model.layers.0.*"], 7),  # a glob over the qualified name
        (["lm_head"], 1),
    ],
)
def test_target_patterns(targets, expected):
    model = build_model(model_config())
    assert len(lora_targets(model, LoraConfig(target_modules=targets))) == expected


def test_a_tied_head_trains_with_its_embedding_or_not_at_all():
    model = build_model(model_config(TIED))
    with pytest.raises(ConfigError, match="ties its head") as error:
        lora_targets(model, LoraConfig(train_head=True))
    assert error.value.path == "trainer.lora.train_head"
    with pytest.raises(ConfigError, match="lm_head is tied"):
        lora_targets(model, LoraConfig(target_modules=["lm_head"]))


@pytest.mark.parametrize("config", [LLAMA, GPT2, TIED], ids=lambda p: p.stem)
def test_adapters_start_at_the_base_and_train_alone(config):
    base = build_model(model_config(config)).eval()
    lora = build_model(model_config(config), lora=LoraConfig(rank=4)).eval()
    assert torch.equal(logits(lora, TOKENS), logits(base, TOKENS))  # B starts at zero
    trained = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trained == lora.trained
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # The base keeps its Hugging Face names: its weights are the plain model's, name by name.
    plain = base.state_dict()
    for name, tensor in lora.state_dict().items():
        if ".lora_" not in name:
            assert torch.equal(tensor, plain[name]), name
    assert set(broadcast_tensors(lora)) == trained


def test_the_adapters_are_drawn_alike_by_every_process():
    a = build_model(model_config(), lora=LoraConfig())
    b = build_model(model_config(), lora=LoraConfig())
    for name in a.trained:
        assert torch.equal(a.get_parameter(name), b.get_parameter(name)), name


def test_embeddings_and_head_train_in_full_when_asked():
    model = build_model(model_config(GPT2), lora=LoraConfig(train_embeddings=True, train_head=True))
    # GPT-2's token and position embeddings; its head is untied in this config.
    assert {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"} <= model.trained
    adapter = peft_config(LoraConfig(train_embeddings=True, train_head=True), model)
    assert adapter["modules_to_save"] == ["transformer.wte", "transformer.wpe", "lm_head"]
    assert adapter["fan_in_fan_out"]  # GPT-2's Conv1D weights are [in, out]


@pytest.mark.parametrize("config", [LLAMA, GPT2], ids=lambda p: p.stem)
def test_merging_gives_the_same_function(config):
    model = build_model(model_config(config), lora=LoraConfig(rank=4, alpha=8)).eval()
    perturb(model)
    before = logits(model, TOKENS)
    assert not torch.allclose(before, logits(build_model(model_config(config)).eval(), TOKENS))
    merged = merge_lora(model)
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())
    torch.testing.assert_close(logits(merged, TOKENS), before, atol=1e-5, rtol=1e-4)


def test_peft_names_round_trip():
    model = build_model(model_config(GPT2), lora=LoraConfig(train_embeddings=True))
    trained = broadcast_tensors(model)
    saved = peft_state(trained)
    assert "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight" in saved
    assert "base_model.model.transformer.wte.weight" in saved
    back = from_peft_state(saved)
    assert back.keys() == trained.keys()


@pytest.mark.parametrize(
    ("config", "lora"),
    [
        (LLAMA, LoraConfig(rank=4, alpha=8)),
        (
            LLAMA,
            LoraConfig(rank=2, target_modules=["q_proj", "model.layers.1.mlp.down_proj"], train_head=True),
        ),
        (GPT2, LoraConfig(rank=4, train_embeddings=True)),
    ],
    ids=["llama", "llama-head", "gpt2-embeddings"],
)
def test_the_adapter_loads_in_peft_with_the_same_logits(tmp_path, config, lora):
    import peft
    import transformers

    model = build_model(model_config(config, seed=2), lora=lora).eval()
    perturb(model)
    with torch.no_grad():  # fully trained modules moved too
        for name in model.trained - {n for n in model.trained if ".lora_" in n}:
            model.get_parameter(name).add_(0.05)
    adapter = peft_config(lora, model)
    (tmp_path / "adapter_config.json").write_text(json.dumps(adapter))
    saved = peft_state(broadcast_tensors(model))
    save_file({k: v.contiguous() for k, v in saved.items()}, str(tmp_path / "adapter_model.safetensors"))

    cfg = json.loads(config.read_text())
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    base = build_model(model_config(config, seed=2))
    hf.load_state_dict(base.state_dict(), strict=True)
    hf = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    with torch.no_grad():
        reference = hf(TOKENS[None]).logits[0]
    torch.testing.assert_close(logits(model, TOKENS), reference, atol=1e-5, rtol=1e-4)
