"""What the dashboard reads from a run folder, as the orchestrator's own writer (RunOutputs)
and `rlrun local` leave it."""

from __future__ import annotations

import json

from rlrun.common.run_folder import append_event
from rlrun.dashboard.runs import RunFolder, find_runs, run_id
from rlrun.orchestrator.run.outputs import RunOutputs


def folder(tmp_path, name="run"):
    path = tmp_path / name
    path.mkdir(parents=True)
    (path / "resolved_config.json").write_text(json.dumps({"name": name, "orchestrator": {"max_steps": 5}}))
    return path.resolve(), RunOutputs(path)


def test_a_runs_phase_follows_what_it_wrote(tmp_path):
    path, out = folder(tmp_path)
    run = RunFolder(path)
    assert run.info()["phase"] == "pending" and run.info()["step"] == 0
    out.append_metrics({"step": 1, "trainer_step": 1, "phase": "warmup"})
    out.append_metrics({"step": 1, "trainer_step": 1, "phase": "dev", "dev_reward": 0.3})
    assert run.info()["phase"] == "warmup" and run.info()["warmup_steps"] == 1
    out.append_metrics({"step": 1, "trainer_step": 2, "phase": "rl", "reward_mean": 0.4, "policy_version": 2})
    out.append_metrics({"step": 1, "trainer_step": 2, "phase": "eval", "eval_reward": 0.5})
    info = run.info()
    assert (info["phase"], info["step"], info["max_steps"], info["live"]) == ("running", 1, 5, True)
    assert (info["train_reward"], info["eval_reward"], info["policy_version"]) == (0.4, 0.5, 2)
    out.write_error("boom")
    assert run.info()["phase"] == "failed" and not run.info()["live"]
    out.write_summary({"phase": "succeeded", "steps": 1})
    assert run.info()["phase"] == "succeeded" and run.error() == "boom\n"


def test_a_line_being_written_is_left_for_later(tmp_path):
    path, out = folder(tmp_path)
    out.append_metrics({"step": 1, "trainer_step": 1, "phase": "rl"})
    with (path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "trainer_st')
    assert [r["step"] for r in RunFolder(path).metrics()] == [1]


def test_trace_files_and_events(tmp_path):
    path, out = folder(tmp_path)
    for phase, step in (("rl", 10), ("warmup", 3), ("rl", 2)):
        out.write_traces(phase, step, [{"step": step}])
    (path / "traces" / "rl_step_x.jsonl").write_text("{}\n")
    (path / "traces" / "notes.txt").write_text("not a trace file")
    run = RunFolder(path)
    assert run.trace_steps() == [
        {"phase": "warmup", "step": 3},
        {"phase": "rl", "step": 2},
        {"phase": "rl", "step": 10},
    ]
    assert run.trace_groups("rl", 10) == [{"step": 10}]
    assert run.trace_groups("rl", 11) is None and run.trace_groups("eval", 10) is None
    out.event("start", trainer_step=0)
    append_event(path, "restart", service="trainer", step=4)
    assert [(e["event"], e.get("service")) for e in run.events()] == [("start", None), ("restart", "trainer")]


def test_runs_are_found_in_run_folders_and_one_level_below(tmp_path):
    a, _ = folder(tmp_path / "outputs", "a")
    b, _ = folder(tmp_path / "outputs", "b")
    (tmp_path / "outputs" / "not-a-run").mkdir()
    (tmp_path / "outputs" / "a" / "nested").mkdir()
    c, _ = folder(tmp_path, "c")
    runs = find_runs([tmp_path / "outputs", c, tmp_path / "missing", a])
    assert sorted(r.path.name for r in runs.values()) == ["a", "b", "c"]
    assert runs[run_id(a)].path == a
    assert run_id(a) == run_id(tmp_path / "outputs" / ".." / "outputs" / "a") != run_id(b)
