"""An out-of-tree sampling knob, installed as a package with an entry point in group
`rlrun.knobs`, is found without a hand import: in a fresh process, by the front end that reads
the request and by the torch engine's own spawned process, which applies it. The same request
without the package installed is refused, naming the knob."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from .conftest import REPO

KNOB = '''
import torch

from rlrun.common.errors import RequestError
from rlrun.inference.logits import LogitsProcessor
from rlrun.inference.logits.base import token_mask


class BannedTokens(LogitsProcessor):
    """Settings: the token ids a sample may never draw."""

    name = "banned_token_ids"
    fields = ("banned_token_ids",)

    def __init__(self, rows, banned):
        self.rows = rows
        self.banned = banned

    @classmethod
    def read(cls, fields):
        value = fields.values.get("banned_token_ids")
        return None if value is None else tuple(value)

    @classmethod
    def check(cls, settings, params, where, vocab_size):
        for token in settings:
            if vocab_size is not None and not 0 <= token < vocab_size:
                raise RequestError(f"{where}.banned_token_ids", "outside the vocabulary")

    @classmethod
    def create(cls, rows, device, history):
        return cls(torch.tensor([row for row, _ in rows], device=device), [banned for _, banned in rows])

    def apply(self, logits):
        mask = token_mask(self.banned, logits.shape[-1], logits.device)
        rows = logits.index_select(0, self.rows).masked_fill(mask, float("-inf"))
        return logits.index_copy(0, self.rows, rows)
'''

SCRIPT = """
import asyncio, json, sys

from rlrun.common.config import load_config
from rlrun.inference.engines import create_engine
from rlrun.inference.params import GenerationParams

PROMPT = [5, 6, 7, 8, 1, 4]


async def main():
    config = load_config("configs/reverse_text.toml", ["inference.engine_process=true"])
    engine = create_engine(config)
    await engine.start()
    try:
        [free] = await engine.generate(PROMPT, GenerationParams(max_tokens=8, temperature=0.0))
        banned = sorted(set(free.token_ids))[:3]
        try:
            params = GenerationParams(max_tokens=8, temperature=0.0, knobs={"banned_token_ids": tuple(banned)})
            [held] = await engine.generate(PROMPT, params)
            print(json.dumps({"engine": type(engine).__name__, "free": free.token_ids, "banned": banned, "held": held.token_ids}))
        except Exception as error:
            print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    finally:
        await engine.stop()


asyncio.run(main())
"""


def run_script(tmp_path, installed: bool) -> dict:
    site = tmp_path / ("site" if installed else "empty")
    site.mkdir()
    if installed:
        (site / "rlrun_test_knob.py").write_text(textwrap.dedent(KNOB))
        info = site / "rlrun_test_knob-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlrun-test-knob\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            "[rlrun.knobs]\nbanned_token_ids = rlrun_test_knob:BannedTokens\n"
        )
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_installed_knob_is_applied_by_the_engine_process(tmp_path):
    out = run_script(tmp_path, installed=True)
    assert out.get("engine") == "TorchEngineProcess", out
    assert out["banned"] and set(out["free"]) & set(out["banned"])
    assert not set(out["held"]) & set(out["banned"]), out  # never drawn, though greedy chose them
    assert len(out["held"]) == len(out["free"])


def test_without_the_package_the_knob_is_unknown(tmp_path):
    out = run_script(tmp_path, installed=False)
    assert "banned_token_ids" in out.get("error", ""), out
