"""Checkpoint state round trips; the run folder is cleared or trimmed for resume."""

from __future__ import annotations

import json
import time

import pytest

from rlrun.orchestrator.run.outputs import RunOutputs
from rlrun.orchestrator.run.state import OrchestratorState


def test_state_round_trips_through_bytes():
    state = OrchestratorState(
        trainer_step=12,
        policy_version=12,
        warmup_steps=4,
        warmup_done=True,
        rl_steps=8,
        sampler={"bit_generator": "PCG64", "state": {"state": 2**100, "inc": 3}},
        algorithms={"ema_per_member": {"b": {"k": 0.5}}},
        eval_reward_start=0.55,
    )
    assert OrchestratorState.from_bytes(state.to_bytes()) == state


@pytest.mark.parametrize(
    "data", [b"\xff\x00", b"[]", b'{"trainer_step": 1}', b'{"format": "rlrun.orchestrator.state/1", "x": 1}']
)
def test_foreign_state_is_refused(data):
    with pytest.raises(ValueError, match="resume_state"):
        OrchestratorState.from_bytes(data)


def test_the_recorded_step_is_the_last_trained_one_and_none_without_a_metrics_file(tmp_path):
    out = RunOutputs(tmp_path)
    assert out.recorded_trainer_step() is None  # a new folder: the trainer's checkpoints decide
    out.append_metrics({"step": 0, "trainer_step": 0, "phase": "eval"})
    assert out.recorded_trainer_step() == 0
    out.append_metrics({"step": 1, "trainer_step": 1, "phase": "warmup"})
    out.append_metrics({"step": 1, "trainer_step": 2, "phase": "rl"})
    out.append_metrics({"step": 1, "trainer_step": 2, "phase": "eval"})
    assert out.recorded_trainer_step() == 2


def test_resume_keeps_exactly_the_checkpointed_steps(tmp_path):
    out = RunOutputs(tmp_path)
    for step in range(1, 4):
        out.append_metrics({"step": step, "trainer_step": step, "phase": "warmup"})
    out.write_rows("eval", "dev_step_2", [])
    out.write_rows("eval", "dev_step_3", [])
    for step in range(1, 6):
        out.append_metrics({"step": step, "trainer_step": 3 + step, "phase": "rl"})
    out.write_rows("eval", "step_0", [])
    out.write_rows("eval", "step_4", [])
    out.write_rows("eval", "step_5", [])
    for phase, steps in (("warmup", 4), ("rl", 5)):
        for step in range(1, steps + 1):
            out.write_traces(phase, step, [{"step": step}])
    out.event("start", trainer_step=0)
    out.write_summary({"steps": 5})
    out.resume_after(trainer_step=7, warmup_steps=3, rl_steps=4)
    lines = [json.loads(line) for line in out.metrics_path.read_text().splitlines()]
    assert [(r["phase"], r["step"]) for r in lines] == [("warmup", 1), ("warmup", 2), ("warmup", 3)] + [
        ("rl", s) for s in range(1, 5)
    ]
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == [
        "dev_step_2.jsonl",
        "dev_step_3.jsonl",
        "step_0.jsonl",
        "step_4.jsonl",
    ]
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == sorted(
        [f"warmup_step_{n}.jsonl" for n in (1, 2, 3)] + [f"rl_step_{n}.jsonl" for n in (1, 2, 3, 4)]
    )
    assert (tmp_path / "events.jsonl").exists()  # the run's history stays
    assert not (tmp_path / "summary.json").exists()


def test_non_finite_numbers_are_written_as_null(tmp_path):
    out = RunOutputs(tmp_path)
    before = time.time()
    out.append_metrics({"step": 1, "trainer_step": 1, "x": float("nan")})
    line = json.loads(out.metrics_path.read_text())
    assert before <= line.pop("time") <= time.time()  # every line is stamped with its wall time
    assert line == {"step": 1, "trainer_step": 1, "x": None}
