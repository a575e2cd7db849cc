"""`rlrun bench sandbox --quick` (the real bubblewrap) ends with one JSON line carrying its ratios."""

from __future__ import annotations

import argparse
import json

import pytest

from rlrun.bench import sandbox as bench


def test_quick_sandbox_bench_reports_rates_and_the_ratio_against_running_directly(tmp_path, capsys):
    output = tmp_path / "bench.json"
    assert bench.main(argparse.Namespace(quick=True, output=output)) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads(output.read_text()) == result
    assert result["sandboxes_per_s"] > 0 and result["sandboxes_with_command_per_s"] > 0
    assert result["ratio_vs_direct"] == pytest.approx(result["command_ms"] / result["direct_ms"])
    assert result["overhead_ms"] == pytest.approx(result["command_ms"] - result["direct_ms"])
