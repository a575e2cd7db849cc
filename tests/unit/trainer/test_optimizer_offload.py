"""`trainer.optimizer.offload = "cpu"`: AdamW's state in host memory. On this CPU machine the
host copies are separate tensors all the same (the path a CUDA trainer takes), and the steps
equal the on-device AdamW's; checkpoints load across the two kinds."""

from __future__ import annotations

import pytest
import torch

from rlrun.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlrun.trainer.distributed import Parallelism
from rlrun.trainer.learner import build_learner
from rlrun.trainer.optim import HostOffloadedAdamW, build_optimizer
from rlrun.trainer.synthetic import synthetic_batch, synthetic_config

SETTINGS = {"grad_steps_per_batch": 2, "weight_decay": 0.1, "lr": 3e-3}


def learner(tmp_path, offload: str):
    config = synthetic_config(tmp_path, trainer={**SETTINGS, "optimizer": {"offload": offload}})
    return build_learner(config, Parallelism.single("cpu"))


def assert_same_state(a, b):
    for name, tensor in a.full_weights().items():
        torch.testing.assert_close(tensor, b.full_weights()[name], rtol=0, atol=0, msg=name)
    state_a, state_b = a.capture_state().optimizer, b.capture_state().optimizer
    for name, entry in state_a["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(
                value, state_b["state"][name][key], rtol=0, atol=0, msg=f"{name}.{key}"
            )


def test_the_offloaded_step_equals_the_on_device_step(tmp_path):
    on_device, offloaded = learner(tmp_path, "none"), learner(tmp_path, "cpu")
    assert isinstance(offloaded.optimizer, HostOffloadedAdamW)
    assert not isinstance(on_device.optimizer, HostOffloadedAdamW)
    for step in range(3):
        expected, got = on_device.train(synthetic_batch(step)), offloaded.train(synthetic_batch(step))
        assert got.metrics["loss"] == expected.metrics["loss"]
    assert_same_state(on_device, offloaded)
    # The state is the model parameters' (as the state-dict APIs and the scheduler want it),
    # held in tensors of its own: no moment shares memory with a parameter or its host copy.
    params = list(offloaded.model.parameters())
    owned = {t.untyped_storage().data_ptr() for p in params for t in (p, offloaded.optimizer._twin[p])}
    for param in params:
        state = offloaded.optimizer.state[param]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        assert all(state[k].device.type == "cpu" for k in state)
        assert state["exp_avg"].untyped_storage().data_ptr() not in owned
        twin = offloaded.optimizer._twin[param]
        assert twin.untyped_storage().data_ptr() != param.untyped_storage().data_ptr()
    assert offloaded.optimizer._host.param_groups[0]["lr"] == offloaded.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize(("saved", "loaded"), [("cpu", "none"), ("none", "cpu")])
def test_a_checkpoint_resumes_across_the_two_kinds(tmp_path, saved, loaded):
    first = learner(tmp_path, saved)
    for step in range(2):
        first.train(synthetic_batch(step))
    path = save_checkpoint(
        tmp_path / "checkpoints", first.capture_state(), b"", {"model_type": "llama"}, world_size=1, keep=5
    )
    # One learner after the other: they share torch's RNG, which the checkpoint restores.
    expected = [first.train(synthetic_batch(step)).metrics["loss"] for step in range(2, 4)]
    resumed = learner(tmp_path, loaded)
    resumed.restore_state(load_checkpoint(path)[0])
    assert [resumed.train(synthetic_batch(step)).metrics["loss"] for step in range(2, 4)] == expected
    assert_same_state(first, resumed)
    if loaded == "cpu":
        assert all(v.device.type == "cpu" for s in resumed.optimizer.state.values() for v in s.values())


def test_offload_with_fsdp_shards_is_refused_naming_the_key(tmp_path):
    config = synthetic_config(tmp_path, trainer={"optimizer": {"offload": "cpu"}})
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r'trainer.optimizer.offload = "cpu" does not run with FSDP'):
        build_optimizer(model, config.trainer, shards=True)
