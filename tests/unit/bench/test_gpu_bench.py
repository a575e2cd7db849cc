"""`rlrun bench gpu` without running it: its options against the device's defaults, its
usage errors, its ratios, its decode loop (the limit) against the model's own forward, and
the one-GPU run file it starts from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlrun.bench import gpu
from rlrun.bench.gpu_parts import DecodeLoop, StaticDecode, parameter_count
from rlrun.cli import build_parser
from rlrun.common.config import load_config
from rlrun.common.model import PackedCausal, build_model

REPO = Path(__file__).resolve().parents[3]

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the bench reads configs/ as a checkout's `rlrun` does


def options(*argv: str):
    return build_parser().parse_args(["bench", "gpu", *argv])


def test_without_cuda_the_cpu_fallback_is_chosen():
    plan = gpu.plan(options(), cuda=False)
    assert (plan.device, plan.fallback, plan.preset, plan.dtype) == ("cpu", True, "tiny", "float32")
    assert plan.scale == gpu.CPU
    assert plan.parts == list(gpu.PARTS)


def test_with_cuda_the_gpu_defaults_and_cpu_forces_the_fallback():
    on_gpu = gpu.plan(options(), cuda=True)
    assert (on_gpu.device, on_gpu.fallback) == ("cuda", False)
    assert (on_gpu.preset, on_gpu.dtype) == ("385m", "bfloat16")
    assert (on_gpu.scale.concurrency, on_gpu.scale.tokens) == (128, 256)
    forced = gpu.plan(options("--cpu"), cuda=True)
    assert (forced.device, forced.fallback, forced.scale) == ("cpu", True, gpu.CPU)
    assert gpu.plan(options("--device", "cpu"), cuda=True).fallback


def test_flags_replace_the_preset_and_the_sizes():
    plan = gpu.plan(
        options("--layers", "4", "--hidden", "256", "--concurrency", "16", "--skip", "local", "--quick"),
        cuda=True,
    )
    assert plan.arch == {"num_hidden_layers": 4, "hidden_size": 256}
    assert plan.scale.concurrency == 16 and plan.scale.tokens == gpu.GPU.tokens
    assert "local" not in plan.parts and plan.most_rounds == 1


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--layers", "0"], "--layers"),
        (["--skip", "nothing"], "--skip"),
        (["--budget", "-5"], "--budget"),
        (["--dtype", "float64"], "--dtype"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(capsys, argv, named):
    with pytest.raises(SystemExit) as exit_:
        options(*argv)
    assert exit_.value.code == 2
    assert f"argument {named}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--cpu", "--device", "cuda"], "--device cuda"),
        (["--kv-heads", "3"], "--kv-heads 3"),
        (["--transport", "pigeon"], "(--transport)"),
    ],
)
def test_a_flag_the_run_cannot_take_is_a_usage_error_naming_it(tmp_path, capsys, argv, named):
    args = options(*argv)
    with pytest.raises(SystemExit) as exit_:
        gpu.setup_for(gpu.plan(args, cuda=False), tmp_path, args.transport)
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_the_385m_preset_is_the_0_4b_qwen3_shape(tmp_path):
    args = options("--model", "385m", "--cpu")
    setup, parameters = gpu.setup_for(gpu.plan(args, cuda=False), tmp_path, None)
    arch = json.loads(Path(setup.config().model.config).read_text())
    assert (arch["model_type"], arch["num_hidden_layers"], arch["hidden_size"]) == ("qwen3", 28, 1024)
    assert 0.35e9 < parameters < 0.45e9
    assert parameters == parameter_count(setup)


def test_ratios_are_each_figure_over_its_baseline():
    figures = {
        "served_tok_s": 900.0,
        "generate_tok_s": 300.0,
        "learner_tok_s": 45.0,
        "bare_tok_s": 50.0,
        "local_s_per_step": 0.62,
    }
    assert gpu.ratios(figures) == {
        "served_vs_generate": 3.0,
        "learner_vs_bare": 0.9,
        "local_speedup_vs_reference": pytest.approx(5.0),
    }


def tiny_model():
    config = load_config(
        gpu.RUN_FILE, ['model.config="configs/models/tiny-d128.json"', 'model.dtype="float32"']
    )
    return build_model(config.model).eval()


def test_the_static_cache_attends_as_the_models_own_forward():
    """A token's hidden state through the limit's static cache (grouped-query: tiny-d128 has
    4 heads over 2 kv heads) is the model's own forward's over the whole sequence."""
    model = tiny_model()
    rows, length = 3, 10
    sequences = torch.randint(
        6, model.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0)
    )
    attend = StaticDecode(model, rows, length)
    with torch.inference_mode():
        for position in range(length):
            attend.position.fill_(position)
            stepped = model.hidden_states(sequences[:, position], attend.position.expand(rows), attend)
            whole = model.hidden_states(
                sequences[:, : position + 1].flatten(),
                torch.arange(position + 1).repeat(rows),
                PackedCausal([position + 1] * rows),
            )
            torch.testing.assert_close(stepped, whole.view(rows, position + 1, -1)[:, -1])


def test_the_decode_loop_generates_the_models_own_greedy_tokens():
    """Each row's tokens of the limit's loop (prompt in, then replays) are the argmax of the
    model's own forward over its whole sequence so far."""
    model = tiny_model()
    prompts = torch.tensor([[5, 9, 14, 3], [7, 7, 30, 2], [40, 41, 42, 43]])
    steps = 6
    with torch.inference_mode():
        loop = DecodeLoop(model, prompts, steps)
        loop.restart()
        generated = [loop.tokens.tolist()]
        for _ in range(steps - 1):
            loop.replay()
            generated.append(loop.tokens.tolist())
        for row, prompt in enumerate(prompts.tolist()):
            sequence = list(prompt)
            for _ in range(steps):
                logits = model(
                    torch.tensor(sequence), torch.arange(len(sequence)), PackedCausal([len(sequence)])
                )
                sequence.append(int(logits[-1].argmax()))
            assert [tokens[row] for tokens in generated] == sequence[len(prompt) :]


def test_the_one_gpu_run_file_checks_but_for_its_devices():
    """configs/gpu/reverse_text_0.4b.toml passes `rlrun check-config`, devices aside (this
    machine may have no GPU: then the device check names the trainer's)."""

    def check(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlrun.cli", "check-config", str(gpu.RUN_FILE), *flags],
            capture_output=True,
            text=True,
            timeout=120,
        )

    checked = check("--no-devices")
    assert checked.returncode == 0, checked.stderr
    resolved = json.loads(checked.stdout)
    assert (resolved["inference"]["device"], resolved["trainer"]["device"]) == ("cuda", "cuda")
    assert resolved["model"]["dtype"] == "bfloat16"
    assert resolved["model"]["config"] == str(gpu.PRESETS["385m"])
    with_devices = check()
    if torch.cuda.is_available():
        assert with_devices.returncode == 0, with_devices.stderr
    else:
        assert with_devices.returncode == 2 and "trainer.device" in with_devices.stderr
