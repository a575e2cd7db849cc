"""The trainer under `[trainer.lora]`: only the adapters train and sit in the optimizer, only
they travel to inference (whose engine then computes the trainer's function), and a
checkpoint keeps them as a PEFT adapter that resumes exactly and exports."""

from __future__ import annotations

import json

import pytest
import torch

from rlrun.cli import main as rlrun
from rlrun.common.errors import RequestError
from rlrun.common.model import build_model
from rlrun.common.weights.grpc_stream import LayoutCache, iter_update_messages, receive_update
from rlrun.common.weights.ipc import StagingBuffer, ipc_header
from rlrun.common.weights.protocol import broadcast_tensors, total_bytes
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.torch_process import TorchEngineProcess
from rlrun.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config

from ..inference.test_torch_engine import argmax_loop

LORA = {"rank": 4, "alpha": 8.0}


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def test_only_the_adapters_train_and_the_optimizer_holds_only_them(make_learner):
    full, lora = make_learner(), make_learner(lora=LORA)
    base = {n: p.detach().clone() for n, p in lora.model.named_parameters() if not p.requires_grad}
    optimized = {p for group in lora.optimizer.param_groups for p in group["params"]}
    adapters = {p for n, p in lora.model.named_parameters() if n in lora.trained}
    assert optimized == adapters and lora.trained
    before = {n: p.detach().clone() for n, p in lora.model.named_parameters() if n in lora.trained}
    for step in range(2):
        full.train(synthetic_batch(step))
        assert not lora.train(synthetic_batch(step)).skipped
    for name, param in lora.model.named_parameters():
        if name in base:
            assert torch.equal(param, base[name]), name  # the base stays frozen
    assert any(not torch.equal(lora.model.get_parameter(n), before[n]) for n in before)
    # AdamW keeps two moments per trained parameter: of the adapters alone under LoRA.
    full_bytes, lora_bytes = optimizer_bytes(full.optimizer), optimizer_bytes(lora.optimizer)
    trained = sum(p.numel() * p.element_size() for p in adapters)
    assert 2 * trained <= lora_bytes < 2 * trained + 8 * len(adapters)  # + one step counter each
    print(
        f"optimizer state, tiny-d64: full {full_bytes} B, LoRA r=4 {lora_bytes} B ({full_bytes / lora_bytes:.1f}x)"
    )


def test_a_sync_carries_nothing_but_what_trains(make_learner):
    """What a sync and a checkpoint carry: the adapters (a full run: every tensor)."""
    lora = make_learner(lora={**LORA, "target_modules": ["q_proj", "v_proj"]})
    sent = lora.full_weights()
    assert set(sent) == lora.trained
    assert all(".lora_A." in n or ".lora_B." in n for n in sent)
    full = make_learner().full_weights()
    print(f"bytes per sync, tiny-d64: full {total_bytes(full)} B, LoRA q,v r=4 {total_bytes(sent)} B")
    assert total_bytes(sent) < total_bytes(full) / 20


async def test_an_update_of_the_adapters_alone_gives_the_engine_the_trainers_function(make_learner, tmp_path):
    learner = make_learner(lora=LORA, lr=0.05)
    for step in range(3):
        learner.train(synthetic_batch(step))
    config = synthetic_config(tmp_path, trainer={"lora": LORA})
    base = build_model(config.model).eval()
    engine = TorchEngineProcess(config)  # the engine `rlrun serve inference` runs
    await engine.start()
    try:
        assert set(engine.weight_specs()) == learner.trained
        tensors = learner.full_weights()

        async def stream():
            for message in iter_update_messages(tensors, 1):
                yield message

        update = await receive_update(stream(), LayoutCache(engine.weight_specs()))
        await engine.update_weights(update.tensors, 1)
        greedy = SamplingParams(max_tokens=12, temperature=0.0)

        async def serves_the_learners_policy() -> None:
            learner.model.eval()
            for prompt in ([5, 6, 7, 8], [40, 41, 42]):
                [completion] = await engine.generate(prompt, greedy)
                assert completion.token_ids == argmax_loop(learner.model, prompt, 12)

        await serves_the_learners_policy()
        assert argmax_loop(base, [5, 6, 7, 8], 12) != argmax_loop(learner.model, [5, 6, 7, 8], 12)
        # Over IPC (shared memory on CPU): the staging buffer holds the adapters alone.
        for step in range(3, 5):
            learner.train(synthetic_batch(step))
        specs = tuple((name, t.dtype, tuple(t.shape)) for name, t in engine.weight_specs().items())
        staging = StagingBuffer(specs, torch.device("cpu"))
        staging.stage(learner.full_weights())
        assert staging.size == total_bytes(learner.full_weights())
        await engine.receive_weights_ipc(ipc_header(staging, 2))
        await serves_the_learners_policy()
        # A whole model is not what this engine takes.
        with pytest.raises(RequestError, match="header.tensors"):
            await engine.update_weights(broadcast_tensors(base), 3)
    finally:
        await engine.stop()


@pytest.mark.parametrize("lora", [LORA, {**LORA, "train_head": True}], ids=["adapters", "with-head"])
def test_a_resumed_lora_run_continues_exactly(make_learner, tmp_path, lora):
    settings = {"lora": lora, "grad_steps_per_batch": 2, "weight_decay": 0.1}
    uninterrupted = make_learner(**settings)
    uninterrupted.train(synthetic_batch(0))
    path = save_checkpoint(
        tmp_path / "checkpoints",
        uninterrupted.capture_state(),
        b"",
        {"model_type": "llama"},
        world_size=1,
        keep=2,
        adapter=uninterrupted.adapter_config,
    )
    # The base is the config's: the checkpoint holds what trains, as a PEFT adapter.
    assert {p.name for p in path.iterdir()} == {"adapter", "trainer_state.pt", "extra_state.bin", "meta.json"}
    assert json.loads((path / "adapter/adapter_config.json").read_text())["r"] == 4
    for step in (1, 2):
        expected = uninterrupted.train(synthetic_batch(step))

    resumed = make_learner(**settings)
    state, _ = load_checkpoint(path)
    resumed.restore_state(state)
    assert resumed.optimizer.state  # the adapters' AdamW moments came back
    for step in (1, 2):
        got = resumed.train(synthetic_batch(step))
    assert got.metrics["loss"] == expected.metrics["loss"]
    a, b = uninterrupted.full_weights(), resumed.full_weights()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_checkpoint_of_another_setting_is_refused(make_learner, tmp_path):
    full = make_learner()
    state = full.capture_state()
    with pytest.raises(ValueError, match="does not hold what this run trains"):
        make_learner(lora=LORA).restore_state(state)


def test_rlrun_export_writes_the_adapter_and_a_merged_checkpoint(make_learner, tmp_path, capsys):
    from rlrun.common.model import load_checkpoint_dir
    from rlrun.common.model.lora import merge_lora

    learner = make_learner(lora=LORA, lr=0.05)
    learner.train(synthetic_batch(0))
    config = synthetic_config(tmp_path, trainer={"lora": LORA})
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'output_dir = "{tmp_path}"\n'
        f'[model]\nconfig = "{config.model.config}"\ntokenizer = "{config.model.tokenizer}"\n'
        "[trainer.lora]\nrank = 4\nalpha = 8.0\n"
        '[[orchestrator.train.env]]\nid = "reverse-text"\n'
    )
    path = save_checkpoint(
        tmp_path / "checkpoints",
        learner.capture_state(),
        b"",
        {},
        world_size=1,
        keep=2,
        adapter=learner.adapter_config,
    )
    out = tmp_path / "export"
    assert rlrun(["export", str(path), "--out", str(out), "--merged", "--config", str(run_file)]) == 0
    assert {p.name for p in (out / "adapter").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    merged = load_checkpoint_dir(out / "merged").eval()
    learner.model.eval()
    reference = merge_lora(learner.model)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], tensor, atol=1e-6, rtol=1e-5)


def test_rlrun_eval_names_the_export_for_a_lora_checkpoint(make_learner, tmp_path):
    from rlrun.common.config import ConfigError
    from rlrun.eval.runner import model_dir

    learner = make_learner(lora=LORA)
    state = learner.capture_state()
    path = save_checkpoint(tmp_path, state, b"", {}, world_size=1, keep=1, adapter=learner.adapter_config)
    with pytest.raises(ConfigError, match="rlrun export") as error:
        model_dir(path)
    assert error.value.path == "--checkpoint"
