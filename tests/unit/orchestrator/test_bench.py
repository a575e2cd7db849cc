"""`rlrun bench orchestrator --quick` ends with one JSON line carrying its figures."""

from __future__ import annotations

import argparse
import json

from rlrun.bench import orchestrator as bench


def test_quick_bench_reports_throughput_and_share_of_a_given_demo_step(tmp_path, capsys):
    demo = tmp_path / "metrics.jsonl"
    demo.write_text(
        "".join(
            json.dumps({"phase": "rl", "step": i, "step_seconds": 0.2, "batch_build_seconds": 0.004}) + "\n"
            for i in range(1, 4)
        )
        + json.dumps({"phase": "eval", "step": 3, "eval_reward": 0.5})
        + "\n"
    )
    output = tmp_path / "out" / "bench.json"
    args = argparse.Namespace(quick=True, output=output, demo_metrics=demo)
    assert bench.main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert json.loads(output.read_text()) == result
    assert result["traces_per_s"] > 0 and result["ratio_vs_bare"] > 0
    assert result["demo_step_ms"] == 200.0
    assert result["share_of_step"] == result["demo_batch_build_ms"] / 200.0
    assert result["recorded_share_of_step"] == 0.02
