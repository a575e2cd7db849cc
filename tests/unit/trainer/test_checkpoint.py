"""Checkpoints: layout, atomic writes, retention, and exact resume."""

from __future__ import annotations

import pytest
import torch

from rlrun.common.model import load_checkpoint_dir
from rlrun.trainer.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
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


def test_resolve_resume(tmp_path, make_learner):
    root = tmp_path / "checkpoints"
    assert resolve_resume(root, None) is None
    assert resolve_resume(root, "latest") is None  # nothing saved yet: a fresh start
    path = save(make_learner(), root)
    assert resolve_resume(root, "latest") == path
    assert resolve_resume(root, str(path)) == path
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        resolve_resume(root, str(tmp_path / "nowhere"))
