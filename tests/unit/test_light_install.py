"""A base install (no extras) runs the orchestrator and the env-server: every module of theirs
imports with the extras' packages refused (a meta-path finder stands in for their absence)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = [
    "torch",
    "safetensors",
    "xxhash",
    "fastapi",
    "uvicorn",
    "llguidance",
    "kopf",
    "kubernetes",
    "matplotlib",
    "wandb",
    "tensorboard",
    "vllm",
    "transformers",
    "datasets",
    "pyarrow",
    "math_verify",
]

BLOCK = f"""
import importlib.abc, sys
REFUSED = {EXTRAS_ONLY!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused: an extra)", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


@pytest.mark.parametrize("package", ["rlrun.orchestrator", "rlrun.env_server"])
def test_the_light_services_import_without_any_extra(package):
    code = BLOCK + (
        "import importlib, pkgutil\n"
        f"pkg = importlib.import_module({package!r})\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "import rlrun.cli, rlrun.checks\n"
        "rlrun.cli.build_parser()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_finder_does_refuse():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK + "import torch"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode != 0 and "refused: an extra" in result.stderr


def test_the_dataset_env_reads_local_files_without_the_datasets_extra(tmp_path):
    """JSONL and CSV need nothing; Parquet, Hugging Face ids and the math scorer name the extra."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "q1", "answer": "a"}\n{"question": "q2", "answer": "b"}\n')
    code = BLOCK + (
        "from rlrun.env_server.envs.dataset import DatasetEnv\n"
        f"env = DatasetEnv(path={str(data)!r}, eval_buckets=1000)\n"
        "assert env.taskset.sizes['train'] + env.taskset.sizes['eval'] == 2\n"
        "for kw in ({'scorer': 'math'}, {'path': None, 'hf_id': 'some/dataset'}):\n"
        f"    args = {{'path': {str(data)!r}, **kw}}\n"
        "    try:\n"
        "        DatasetEnv(**args)\n"
        "    except ValueError as error:\n"
        '        assert "rlrun\'s `datasets` extra" in str(error), error\n'
        "    else:\n"
        "        raise AssertionError(kw)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
