"""Checkpoints: layout, atomic writes, retention, and exact resume."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.model import load_checkpoint_dir
from rlrun.trainer.checkpoint import (
    CorruptCheckpoint,
    discard_after,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    start_fresh,
)
from rlrun.trainer.synthetic import synthetic_batch

ARCH = {"model_type": "llama"}


def save(learner, root, extra: bytes = b"", keep: int = 5, arch: dict = ARCH):
    return save_checkpoint(root, learner.capture_state(), extra, arch, world_size=1, keep=keep)


def weights(learner) -> dict[str, torch.Tensor]:
    return learner.full_weights()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("saved_after", [0, 2])
def test_a_resumed_run_takes_the_same_next_step_as_an_uninterrupted_one(make_learner, tmp_path, saved_after):
    settings = dict(
        grad_steps_per_batch=2,
        weight_decay=0.1,
        schedule={"kind": "cosine", "warmup_steps": 2, "total_steps": 6},
    )
    uninterrupted = make_learner(**settings)
    for step in range(saved_after):
        uninterrupted.train(synthetic_batch(step))
    path = save(uninterrupted, tmp_path / "checkpoints", extra=b"orchestrator state")
    for step in range(saved_after, saved_after + 2):
        expected = uninterrupted.train(synthetic_batch(step))

    resumed = make_learner(**settings)
    state, extra = load_checkpoint(path)
    resumed.restore_state(state)
    assert extra == b"orchestrator state"
    assert (resumed.step, resumed.version) == (saved_after, saved_after)
    for step in range(saved_after, saved_after + 2):
        got = resumed.train(synthetic_batch(step))
    assert got.metrics["loss"] == expected.metrics["loss"]
    assert got.metrics["lr"] == expected.metrics["lr"]
    assert_same_weights(weights(uninterrupted), weights(resumed))


def test_the_checkpoint_layout_serves_as_a_hugging_face_model(make_learner, tmp_path):
    from rlrun.common.model import arch_dict
    from rlrun.trainer.synthetic import synthetic_config

    learner = make_learner(model="tiny-d128")
    learner.train(synthetic_batch(0))
    arch = arch_dict(synthetic_config(tmp_path, model="tiny-d128").model)
    path = save(learner, tmp_path / "checkpoints", arch=arch)
    assert path.name == "step_1"
    assert {p.name for p in path.iterdir()} == {"model", "trainer_state.pt", "extra_state.bin", "meta.json"}
    model = load_checkpoint_dir(path / "model")
    assert_same_weights(
        {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, weights(learner)
    )


def test_only_the_newest_checkpoints_are_kept_and_no_temporary_folder_remains(make_learner, tmp_path):
    learner = make_learner()
    root = tmp_path / "checkpoints"
    for step in range(4):
        learner.train(synthetic_batch(step))
        save(learner, root, keep=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_3", "step_4"]
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_4"]
    assert latest_checkpoint(root) == root / "step_4"


def test_saving_the_same_step_again_replaces_it(make_learner, tmp_path):
    learner = make_learner()
    root = tmp_path / "checkpoints"
    save(learner, root, extra=b"first")
    path = save(learner, root, extra=b"second")
    assert load_checkpoint(path)[1] == b"second"
    assert [p.name for p in root.iterdir()] == ["step_0"]


def test_an_incomplete_folder_is_never_taken_for_a_checkpoint(make_learner, tmp_path):
    root = tmp_path / "checkpoints"
    save(make_learner(), root)
    (root / "step_9").mkdir()  # e.g. copied by hand, without meta.json
    (root / ".tmp-step_7-abcd").mkdir()
    assert latest_checkpoint(root) == root / "step_0"


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(
            lambda path: (path / "model" / "model.safetensors").write_bytes(b"cut short"), id="truncated"
        ),
        pytest.param(lambda path: (path / "trainer_state.pt").unlink(), id="file-missing"),
        pytest.param(lambda path: flip_a_byte(path / "model" / "model.safetensors"), id="bit-flip"),
        pytest.param(lambda path: (path / "meta.json").write_text("{"), id="meta-unreadable"),
    ],
)
def test_a_corrupt_checkpoint_is_never_loaded_and_the_one_before_is_used(make_learner, tmp_path, damage):
    learner = make_learner()
    root = tmp_path / "checkpoints"
    older = save(learner, root, extra=b"older")
    learner.train(synthetic_batch(0))
    newest = save(learner, root, extra=b"newest")
    damage(newest)
    with pytest.raises(CorruptCheckpoint):
        load_checkpoint(newest)
    assert latest_checkpoint(root) == older
    assert load_checkpoint(older)[1] == b"older"


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_latest_checkpoint_respects_max_step_and_a_rollback_discards_later_ones(make_learner, tmp_path):
    learner = make_learner()
    root = tmp_path / "checkpoints"
    for step in range(3):
        save(learner, root)
        learner.train(synthetic_batch(step))
    assert latest_checkpoint(root, max_step=1) == root / "step_1"
    assert latest_checkpoint(root, max_step=-1) is None
    assert [p.name for p in discard_after(root, 1)] == ["step_2"]
    assert [p.name for p in list_checkpoints(root)] == ["step_0", "step_1"]


def test_start_fresh_removes_every_checkpoint(make_learner, tmp_path):
    root = tmp_path / "checkpoints"
    assert not start_fresh(root)
    save(make_learner(), root)
    assert start_fresh(root)
    assert latest_checkpoint(root) is None
