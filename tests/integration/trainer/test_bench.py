"""`rlrun bench trainer --quick` runs end to end and ends with its JSON line."""

from __future__ import annotations

import argparse
import json

from rlrun.bench import trainer as bench


def test_quick_bench_ends_with_one_json_line_holding_both_ratios(capsys, tmp_path):
    output = tmp_path / "bench.json"
    assert bench.main(argparse.Namespace(quick=True, output=output)) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["ratio_vs_bare_loop"] > 0 and result["broadcast_ratio_vs_raw"] > 0
    assert result["broadcast_bytes"] > 0 and result["tokens_per_step"] > 0
    assert json.loads(output.read_text()) == result
