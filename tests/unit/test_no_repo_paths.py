"""Installed code never reads repository paths: no module under services/ climbs from its own
file above its package, and the entry points that read shipped files work from a directory
with no checkout in sight."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"
# Path(__file__)...parents[N] with N >= 1, or .parent.parent: a climb out of the module's folder.
CLIMB = re.compile(r"__file__\)[^\n]*?(\.parents\[[1-9]\]|\.parent\.parent)")


def test_no_module_builds_a_path_above_its_own_package():
    offenders = [
        f"{path.relative_to(SERVICES)}:{n}"
        for path in sorted(SERVICES.rglob("*.py"))
        if "v1" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CLIMB.search(line)
    ]
    assert not offenders, f"modules that find repo paths from __file__: {offenders}"


def test_climb_pattern_catches_the_old_forms():
    assert CLIMB.search('CONFIGS = Path(__file__).resolve().parents[2] / "configs"')
    assert CLIMB.search("ROOT = Path(__file__).resolve().parent.parent")
    assert not CLIMB.search("ROOT = Path(__file__).resolve().parent")


def test_entry_points_that_read_files_run_outside_the_checkout(tmp_path):
    """cwd is a folder outside the checkout and PYTHONPATH is unset: only the installed package
    is found. The CRD generator gets its checkout (a copy of the chart) as --root."""
    shutil.copytree(SERVICES.parent / "charts", tmp_path / "checkout" / "charts")
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from rlrun.common import builtin
        from rlrun.common.tokenizer import load_tokenizer
        from rlrun.operator import crd
        from rlrun.trainer.synthetic import synthetic_config

        config = synthetic_config(Path("out"), model="tiny-d64")
        assert Path(config.model.config).is_file(), config.model.config
        arch = json.loads(Path(config.model.config).read_text())
        tokenizer = load_tokenizer(config.model.tokenizer, None)
        assert tokenizer.vocab_size <= arch["vocab_size"]
        for name in ("tiny-d128", "tiny-gpt2-d64", "tiny-gpt2-d64-l3"):
            assert builtin.model_config(name).is_file()
        assert (builtin.tokenizer("lowercase") / "tokenizer.json").is_file()
        root = Path("checkout")
        assert crd.main(["--root", str(root)]) == 0
        assert crd.main(["--check", "--root", str(root)]) == 0
        assert all(path.is_file() for path in crd.outputs(root))
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
