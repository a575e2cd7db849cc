"""The dashboard's trace files (orchestrator.traces), written by the real run against the fake
services of conftest.py: which groups, which lines, the token texts the replica decodes."""

from __future__ import annotations

import json
from pathlib import Path

from rlrun.common.config.model import CHAR_TOKENIZER
from rlrun.common.tokenizer import CharTokenizer
from rlrun.common.wire.orchestrator import RunStatus
from rlrun.orchestrator.run.run import Run

REPO = Path(__file__).resolve().parents[3]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_each_step_writes_a_sample_of_its_groups_with_their_token_texts(stack, tmp_path):
    config = stack.config(
        tmp_path,
        max_steps=4,
        batch_size=4,
        save_rollouts_interval=1,
        traces={"groups_per_step": 2, "interval": 2},
    )
    status = RunStatus()
    await Run(config, status).execute()
    assert status.phase == "succeeded", status.last_error
    folder = tmp_path / "run" / "traces"
    assert sorted(p.name for p in folder.iterdir()) == ["rl_step_2.jsonl", "rl_step_4.jsonl"]
    chars = CharTokenizer.from_file(REPO / CHAR_TOKENIZER)
    for step in (2, 4):
        groups = lines(folder / f"rl_step_{step}.jsonl")
        trained = [g for g in groups if g["dropped"] is None]
        dump = {r["id"]: r for r in lines(tmp_path / "run" / "rollouts" / f"step_{step}.jsonl")}
        assert len(trained) == 2 and all(g["step"] == step and g["phase"] == "rl" for g in groups)
        assert len({g["group_id"] for g in trained}) == 2  # two groups of the batch's four
        for group in trained:
            assert {t["groupId"] for t in group["traces"]} == {group["group_id"]}
            assert all(t == dump[t["id"]] for t in group["traces"])
            ids = {tok for t in group["traces"] for n in t["nodes"] for tok in n["tokenIds"]}
            assert group["tokens"] == {str(i): chars.decode([i], skip_special_tokens=False) for i in ids}
    # each id is asked for once in the run (the texts are cached)
    assert stack.inference.detokenized == len(
        {k for s in (2, 4) for g in lines(folder / f"rl_step_{s}.jsonl") for k in g["tokens"]}
    )


async def test_no_trace_files_when_turned_off(stack, tmp_path):
    config = stack.config(tmp_path, max_steps=2, traces={"groups_per_step": 0, "dropped_per_step": 0})
    status = RunStatus()
    await Run(config, status).execute()
    assert status.phase == "succeeded", status.last_error
    assert not (tmp_path / "run" / "traces").exists() and stack.inference.detokenized == 0
