"""The shared transformer matches Hugging Face's implementation, in every attention mode."""

import importlib
import json
from pathlib import Path

import pytest
import torch

from rlrun.common.config import ModelConfig
from rlrun.common.model import (
    ArchConfig,
    CausalLM,
    PackedCausal,
    SlotKVCache,
    build_model,
    create_model,
    load_checkpoint_dir,
    save_checkpoint_dir,
)

REPO = Path(__file__).resolve().parents[3]
CONFIGS = [
    REPO / "configs/models/tiny-d64.json",
    REPO / "configs/models/tiny-d128.json",
    REPO / "configs/models/tiny-gpt2-d64.json",
]


def model_config(config: Path, **fields) -> ModelConfig:
    """The config with a tokenizer that fits its vocabulary (the GPT-2 demo model is lowercase-only)."""
    vocab = json.loads(config.read_text())["vocab_size"]
    tokenizer = "char" if vocab >= 102 else "lowercase"
    return ModelConfig(config=config, tokenizer=REPO / "configs/tokenizer" / tokenizer, **fields)


def hf_twin(model: CausalLM, cfg: dict):
    transformers = importlib.import_module("transformers")
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf.eval()


@pytest.fixture(params=CONFIGS, ids=lambda p: p.stem)
def pair(request):
    torch.manual_seed(0)
    cfg = json.loads(request.param.read_text())
    model = create_model(ArchConfig.from_dict(cfg))
    model.init_weights(seed=1)
    return model.eval(), hf_twin(model, cfg)


@pytest.mark.parametrize("lengths", [[7, 3, 11], [6, 6, 6]], ids=["ragged", "uniform"])
def test_packed_forward_matches_transformers(pair, lengths):
    model, hf = pair
    seqs = [torch.randint(0, model.config.vocab_size, (n,)) for n in lengths]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    positions = torch.cat([torch.arange(n) for n in lengths])
    with torch.no_grad():
        packed = model(torch.cat(seqs), positions, PackedCausal.from_offsets(cu))
        for i, seq in enumerate(seqs):
            reference = hf(seq[None]).logits[0]
            torch.testing.assert_close(packed[cu[i] : cu[i + 1]], reference, atol=1e-5, rtol=1e-4)


def test_kv_cache_prefill_and_decode_match_a_full_forward(pair):
    model, hf = pair
    cfg = model.config
    cache = SlotKVCache(
        cfg.num_layers,
        slots=3,
        max_len=16,
        kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype=torch.float32,
    )
    a, b = torch.randint(0, cfg.vocab_size, (9,)), torch.randint(0, cfg.vocab_size, (6,))
    with torch.no_grad():
        full_a, full_b = hf(a[None]).logits[0], hf(b[None]).logits[0]
        # prefill a in slot 2 and b's prompt in slot 0 in one step, then decode both together
        ids = torch.cat([a[:5], b[:3]])
        slots = torch.tensor([2] * 5 + [0] * 3)
        pos = torch.cat([torch.arange(5), torch.arange(3)])
        out = model(ids, pos, cache.step(slots, pos, [5, 3]))
        torch.testing.assert_close(out[:5], full_a[:5], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out[5:], full_b[:3], atol=1e-5, rtol=1e-4)
        for p in range(3, 5):  # slots 0 and 2 of 0..2 running: attended in place
            step = cache.step(torch.tensor([2, 0]), torch.tensor([p + 2, p]))
            assert step.in_place
            out = model(torch.stack([a[p + 2], b[p]]), torch.tensor([p + 2, p]), step)
            torch.testing.assert_close(out[0], full_a[p + 2], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out[1], full_b[p], atol=1e-5, rtol=1e-4)
        # a alone in slot 2 (slots 0..2 mostly free: gathered), while c's prompt joins in slot 1
        c = torch.randint(0, cfg.vocab_size, (4,))
        step = cache.step(torch.tensor([2, 1, 1, 1, 1]), torch.tensor([7, 0, 1, 2, 3]), [4])
        assert not step.in_place
        out = model(torch.cat([a[7:8], c]), torch.tensor([7, 0, 1, 2, 3]), step)
        torch.testing.assert_close(out[0], full_a[7], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out[1:], hf(c[None]).logits[0], atol=1e-5, rtol=1e-4)
        step = model(a[8:9], torch.tensor([8]), cache.step(torch.tensor([2]), torch.tensor([8])))
        torch.testing.assert_close(step[0], full_a[8], atol=1e-5, rtol=1e-4)


def test_seeded_init_is_reproducible_and_seed_dependent():
    cfg = ModelConfig(config=CONFIGS[0])
    a, b = build_model(cfg), build_model(cfg)
    c = build_model(cfg.model_copy(update={"seed": 1}))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    params = sum(p.numel() for p in a.parameters())
    assert 90_000 < params < 130_000


def tied_gpt2(tmp_path) -> Path:
    path = tmp_path / "tiny-gpt2-tied.json"
    path.write_text(json.dumps({**json.loads(CONFIGS[2].read_text()), "tie_word_embeddings": True}))
    return path


@pytest.mark.parametrize("config", [*CONFIGS, "tied-gpt2"], ids=lambda p: getattr(p, "stem", p))
def test_checkpoint_directory_round_trip(tmp_path, config):
    config = tied_gpt2(tmp_path) if config == "tied-gpt2" else config
    model = build_model(model_config(config, seed=3))
    save_checkpoint_dir(model, json.loads(config.read_text()), tmp_path / "ckpt")
    loaded = build_model(ModelConfig(path=tmp_path / "ckpt", tokenizer=model_config(config).tokenizer))
    for (name, pa), pb in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    if model.config.tie_word_embeddings:
        embedding = loaded.get_parameter(loaded.embedding_key)
        assert loaded.lm_head.weight.data_ptr() == embedding.data_ptr()


def test_original_gpt2_checkpoint_layout_loads(tmp_path):
    """OpenAI's GPT-2 files name tensors without `transformer.` and keep causal-mask buffers."""
    from safetensors.torch import save_file

    model = build_model(model_config(CONFIGS[2], seed=5))
    state = {k.removeprefix("transformer."): v.contiguous() for k, v in model.state_dict().items()}
    state["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    (tmp_path / "config.json").write_text(CONFIGS[2].read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint_dir(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_pytorch_init_keeps_module_defaults():
    model = build_model(model_config(CONFIGS[2], seed=0, init="pytorch"))
    again = build_model(model_config(CONFIGS[2], seed=0, init="pytorch"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    params = dict(model.named_parameters())
    assert 0.9 < params["transformer.wte.weight"].std() < 1.1
    fc = params["transformer.h.0.mlp.c_fc.weight"]  # [in=64, out=256]
    assert fc.abs().max() <= 1 / 64**0.5 and fc.abs().max() > 0.9 / 64**0.5
    down = params["transformer.h.0.mlp.c_proj.bias"]  # fan_in 256
    assert down.abs().max() <= 1 / 256**0.5 and down.abs().max() > 0.9 / 256**0.5
    assert torch.equal(params["transformer.h.1.ln_2.weight"], torch.ones(64))
    assert torch.equal(params["transformer.ln_f.bias"], torch.zeros(64))


def test_transformers_init_scales_gpt2_residual_projections():
    params = dict(build_model(model_config(CONFIGS[2], seed=0)).named_parameters())
    std = 0.02
    assert abs(params["transformer.h.0.mlp.c_fc.weight"].std() - std) < 0.002
    assert abs(params["transformer.h.0.mlp.c_proj.weight"].std() - std / 2) < 0.001  # 1/sqrt(2 * 2 layers)
    assert torch.equal(params["transformer.h.0.attn.c_attn.bias"], torch.zeros(192))


def test_a_tokenizer_larger_than_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="tokenizer/char has 102 tokens but the model's vocab_size is 33"):
        build_model(ModelConfig(config=CONFIGS[2], tokenizer=REPO / "configs/tokenizer/char"))


def test_learned_positions_bound_the_context():
    with pytest.raises(ValueError, match="model.max_model_len 65 exceeds the model's 64 learned positions"):
        build_model(model_config(CONFIGS[2], max_model_len=65))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation_function": "relu"}, "activation_function 'relu' is not supported"),
        ({"n_head": 5}, "n_embd 64 is not divisible by n_head 5"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn is not supported"),
    ],
)
def test_unsupported_gpt2_settings_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        ArchConfig.from_dict({**json.loads(CONFIGS[2].read_text()), **change})


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_checkpoint_loads_into_transformers_too(tmp_path, config):
    transformers = importlib.import_module("transformers")
    model = build_model(model_config(config, seed=4)).eval()
    save_checkpoint_dir(model, json.loads(config.read_text()), tmp_path / "ckpt")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", local_files_only=True).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        ours = model(ids[0], torch.arange(8), PackedCausal([8]))
        torch.testing.assert_close(ours, hf(ids).logits[0], atol=1e-5, rtol=1e-4)


def test_broken_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_checkpoint_dir(tmp_path)
    (tmp_path / "config.json").write_text(CONFIGS[0].read_text())
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_checkpoint_dir(tmp_path)
    with pytest.raises(ValueError, match="not supported"):
        ArchConfig.from_dict({**json.loads(CONFIGS[0].read_text()), "model_type": "gpt_neox"})
