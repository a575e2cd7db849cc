"""rlrun.checks: the one set of checks every entry point runs before it starts anything
(algorithms and their args, external envs, files, env ids and args, the envs built, their
prompts against the tokenizer, devices, ports), each finding naming its key and, for a
misspelt name, the nearest valid one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlrun.checks import PROMPT_CHECK_TASKS, Scope, check_run, used_algorithms
from rlrun.cli import main
from rlrun.common.config import ConfigError, load_config
from rlrun.common.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
VF_ENVS = REPO / "tests" / "support" / "vf_envs"
SHIPPED = sorted((REPO / "configs").rglob("*.toml")) + sorted(VF_ENVS.glob("*.toml"))
RLRUN = Path(sys.executable).with_name("rlrun")
"""The console script, as a user runs it."""


def config(*overrides: str, path: str = "reverse_text.toml"):
    return load_config(REPO / "configs" / path, list(overrides))


def finding(*overrides: str, path: str = "reverse_text.toml", scope: Scope | None = None) -> str:
    with pytest.raises(ConfigError) as error:
        check_run(config(*overrides, path=path), scope)
    return str(error.value)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_check_config_accepts_every_shipped_config(path):
    """Through the console script, from the checkout, as the README says to run them (the
    verifiers example with its folder on the path); a GPU config is checked without its devices."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(VF_ENVS)}
    devices = ["--no-devices"] if "gpu" in path.parts else []
    result = subprocess.run(
        [str(RLRUN), "check-config", str(path.relative_to(REPO)), *devices],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"]


def test_a_table_for_an_algorithm_the_run_does_not_use_is_named_with_the_nearest_id():
    run = config('orchestrator.algorithm_args.gpro={"std_normalize" = true}')
    with pytest.raises(
        ConfigError,
        match=r"algorithm_args\.gpro: .*'gpro', which the run does not use \(did you mean grpo\?\)",
    ):
        check_run(run, Scope.service("orchestrator"))


def test_bad_args_of_a_builtin_algorithm_name_the_nearest_valid_one():
    run = config('orchestrator.algorithm_args.grpo={"std_normalise" = true}')
    with pytest.raises(
        ConfigError,
        match=r"orchestrator\.algorithm_args\.grpo: std_normalise: unknown key \(did you mean std_normalize\?\)",
    ):
        check_run(run, Scope.service("orchestrator"))


def test_the_warm_start_algorithm_counts_as_used_only_with_a_warm_start():
    run = config("orchestrator.warm_start.max_steps=0")
    assert "sft" not in used_algorithms(run.orchestrator)
    warm = config("orchestrator.warm_start.max_steps=2")
    assert used_algorithms(warm.orchestrator)[warm.orchestrator.warm_start.algorithm] == (
        "orchestrator.warm_start.algorithm"
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ['orchestrator.train.env.0.id="revers-text"'],
            "orchestrator.train.env.0.id: unknown environment 'revers-text' (did you mean reverse-text?)",
        ),
        (
            ['orchestrator.train.env.0.id="no_such_pkg.envs:Letters"'],
            "orchestrator.train.env.0.id: environment 'no_such_pkg.envs:Letters': cannot import "
            "no_such_pkg.envs: No module named 'no_such_pkg'; is the folder that holds it on PYTHONPATH?",
        ),
        (
            ['orchestrator.train.env.0.id="rlrun.env_server.envs.reverse_text:ReverseTxt"'],
            "module rlrun.env_server.envs.reverse_text has no 'ReverseTxt' (did you mean ReverseText?)",
        ),
        (
            ["orchestrator.train.env.0.args={min_lenn = 3}"],
            "orchestrator.train.env.0.args.min_lenn: env 'reverse-text' takes no argument 'min_lenn' "
            "(did you mean min_len?)",
        ),
        (
            ["orchestrator.train.env.0.args={min_len = 9}"],
            "orchestrator.train.env.0.args: env 'reverse-text' cannot be built: need 1 <= min_len <= max_len",
        ),
        (
            ['orchestrator.train.env.0.id="alphabet-sort"', "orchestrator.train.env.0.args={}"]
            + ['orchestrator.algorithms=["grpo", "mystery"]', "orchestrator.warm_start.max_steps=0"],
            "orchestrator.algorithms: algorithm 'mystery' is not builtin and env 'alphabet-sort' owns no algorithms",
        ),
        (
            ['orchestrator.algorithms=["length_penalti"]', "orchestrator.algorithm_args={}"],
            "orchestrator.algorithms: algorithm 'length_penalti' is not builtin (did you mean length_penalty?) "
            "and env 'reverse-text' owns only length_penalty",
        ),
        (['model.config="no/such/model.json"'], "model.config: no/such/model.json does not exist"),
        (
            ['model.tokenizer="configs/tokenizer/lowercas"'],
            "model.tokenizer: configs/tokenizer/lowercas does not exist",
        ),
        (['trainer.device="cuda:7"'], "trainer.device: device 'cuda:7' does not exist (this machine has"),
        (['inference.device="cuda"'], "inference.device: device 'cuda' does not exist"),
        (
            ['orchestrator.train.env.0.address="127.0.0.1:1"'],
            "orchestrator.train.env.0.args: env 'reverse-text' is external",
        ),
    ],
)
def test_what_can_be_checked_without_starting_anything(overrides, expected):
    assert expected in finding(*overrides)


def test_a_dataset_column_typo_names_the_argument_and_the_nearest_column():
    message = finding('orchestrator.train.env.0.args.prompt="{wrd}"', path="dataset_words.toml")
    assert message.startswith("orchestrator.train.env.0.args: env 'dataset' cannot be built: ")
    assert (
        "`prompt` names column 'wrd', which the row lacks (did you mean word?) (columns: reversed, word)"
        in message
    )
    message = finding('orchestrator.eval.env.0.args.answer="reversd"', path="dataset_words.toml")
    assert "orchestrator.eval.env.0.args: " in message and "(did you mean reversed?)" in message


def test_a_prompt_the_tokenizer_cannot_encode_is_found_before_anything_starts(tmp_path):
    rows = tmp_path / "words.jsonl"
    rows.write_text("".join(json.dumps({"w": w, "r": w[::-1]}) + "\n" for w in ["abc", "dEf", "xyz"] * 10))
    args = f'{{path = "{rows}", prompt = "{{w}}", answer = "r", eval_buckets = 2}}'
    message = finding(f"orchestrator.train.env.0.args={args}", path="dataset_words.toml")
    assert "orchestrator.train.env.0: env 'words': the prompt of" in message
    assert "('dEf') holds characters the tokenizer configs/tokenizer/lowercase cannot encode: 'E'" in message
    # The char tokenizer, which has upper case, takes it.
    check_run(
        config(
            f"orchestrator.train.env.0.args={args}",
            'model.tokenizer="configs/tokenizer/char"',
            path="dataset_words.toml",
        )
    )


def test_the_tokenizers_say_what_they_cannot_encode(tmp_path):
    lowercase = load_tokenizer(REPO / "configs" / "tokenizer" / "lowercase")
    assert lowercase.unknown("abc") == ""
    assert lowercase.unknown("Abc DEA") == "A DE"
    assert load_tokenizer(REPO / "configs" / "tokenizer" / "char").unknown("naïve café") == "ïé"
    tokenizers = pytest.importorskip("tokenizers")
    words = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]")
    )
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "words"
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", eos_token="[UNK]").save_pretrained(
        folder
    )
    hf = load_tokenizer(folder)
    assert type(hf).__name__ == "HFTokenizer"
    assert hf.unknown("hello world") == ""
    assert hf.unknown("hello there world there") == "there"


def test_every_finding_is_reported_at_once():
    message = finding(
        "orchestrator.train.env.0.args={min_lenn = 3}",
        'trainer.device="cuda:7"',
        "orchestrator.algorithm_args.echo={}",
    )
    lines = message.splitlines()
    assert len(lines) == 3, message
    assert lines[0].startswith("orchestrator.algorithm_args.echo: a table for algorithm 'echo'")
    assert lines[1].startswith("  and orchestrator.train.env.0.args.min_lenn: ")
    assert lines[2].startswith("  and trainer.device: ")


def test_a_taken_port_names_the_port_and_its_key():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = finding(f"inference.http_port={port}")
    assert message.startswith(
        f"inference.http_port: port {port} on 127.0.0.1 is taken (address already in use)"
    )
    check_run(config(f"inference.http_port={port}"))  # free again


def test_a_service_checks_its_own_part():
    """`rlrun serve`: the trainer does not check the env, the env-server does not check the
    trainer's device, and an env-server hosting one entry does not check the others."""
    bad_env, bad_device = "orchestrator.train.env.0.args={min_lenn = 3}", 'trainer.device="cuda:7"'
    run = config(bad_env, bad_device)
    with pytest.raises(ConfigError, match=r"^trainer\.device") as trainer:
        check_run(run, Scope.service("trainer"))
    assert "min_lenn" not in str(trainer.value)
    with pytest.raises(ConfigError, match=r"^orchestrator\.train\.env\.0\.args\.min_lenn") as env_server:
        check_run(run, Scope.service("env-server"))
    assert "trainer.device" not in str(env_server.value)
    two = config('orchestrator.eval.env=[{id = "reverse-text", name = "held-out", args = {max_len = 0}}]')
    check_run(two, Scope.service("env-server", ["reverse-text"]))
    with pytest.raises(
        ConfigError, match=r"^orchestrator\.eval\.env\.0\.args: env 'reverse-text' cannot be built"
    ):
        check_run(two, Scope.service("env-server", ["held-out"]))


def test_the_operator_scope_checks_what_the_file_alone_says():
    """The pods run elsewhere: no files, devices or imports of the env-server image's packages;
    the built-in envs' ids and args, the algorithms and external entries are still checked."""
    elsewhere = config(
        'model.config="/data/model.json"',
        'trainer.device="cuda:0"',
        'orchestrator.train.env.0.id="pkg.mod:Env"',
    )
    check_run(elsewhere, Scope.cluster())
    assert "did you mean reverse-text" in finding(
        'orchestrator.train.env.0.id="reverse_text"', scope=Scope.cluster()
    )
    assert "did you mean min_len" in finding(
        "orchestrator.train.env.0.args={minlen = 3}", scope=Scope.cluster()
    )


def test_the_prompt_check_reads_a_bounded_number_of_generated_tasks():
    """A generated taskset of a million tasks is drawn on demand: only the first
    PROMPT_CHECK_TASKS of each split are read."""
    from rlrun.checks import _prompts
    from rlrun.env_server.envs.reverse_text import ReverseText

    seen = list(_prompts(ReverseText(train_size=1_000_000)))
    splits = {split for split, _, _ in seen}
    assert splits == {"train", "eval"}
    assert max(idx for split, idx, _ in seen if split == "train") == PROMPT_CHECK_TASKS - 1


def test_check_config_exits_2_naming_the_key(capsys):
    path = str(REPO / "configs" / "reverse_text.toml")
    assert main(["check-config", path, "--set", "orchestrator.algorithm_args.echo={}"]) == 2
    assert "rlrun check-config: invalid config: orchestrator.algorithm_args.echo" in capsys.readouterr().err
    assert main(["check-config", path, "--set", 'trainer.device="cuda:7"', "--no-devices"]) == 0


@pytest.mark.parametrize("command", ["local", "eval"])
def test_local_and_eval_refuse_before_starting_anything(tmp_path, capsys, command):
    """The same checks as check-config (issue 48: `rlrun local` trained with a table for an
    unused algorithm id); nothing is written or started."""
    out = tmp_path / "out"
    argv = [command, str(REPO / "configs" / "reverse_text.toml"), "--output-dir", str(out)]
    argv += ["--endpoint", "http://127.0.0.1:1/v1"] if command == "eval" else []
    assert main([*argv, "--set", 'orchestrator.algorithm_args.gpro={"std_normalize" = true}']) == 2
    err = capsys.readouterr().err
    assert f"rlrun {command}: invalid config: orchestrator.algorithm_args.gpro: " in err
    assert "did you mean grpo?" in err
    assert not out.exists()


def test_context_groups_must_divide_the_trainer_ranks_where_the_entry_point_decides_them(tmp_path, capsys):
    """`rlrun local` starts one trainer process: context_parallel = 2 is refused before anything
    starts. torchrun decides the ranks of `rlrun serve trainer` (the trainer checks them as it
    starts) and check-config checks the file alone; the operator passes its spec's ranks."""
    two = "trainer.context_parallel=2"
    out = tmp_path / "out"
    argv = ["local", str(REPO / "configs" / "reverse_text.toml"), "--output-dir", str(out), "--set", two]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "rlrun local: invalid config: trainer.context_parallel: context groups of 2 ranks" in err
    assert "the trainer's 1 rank(s)" in err
    assert not out.exists()
    assert main(["check-config", str(REPO / "configs" / "reverse_text.toml"), "--set", two]) == 0
    check_run(config(two), Scope.service("trainer"))
    check_run(config(two), Scope.cluster(trainer_ranks=4))
    assert "the trainer's 3 rank(s)" in finding(two, scope=Scope.cluster(trainer_ranks=3))


def test_an_unknown_tool_call_parser_is_refused_naming_the_key_and_the_nearest(capsys):
    path = str(REPO / "configs" / "reverse_text.toml")
    assert (
        main(["check-config", path, "--no-devices", "--set", 'inference.tool_call_parser="qwen3-coder"']) == 2
    )
    err = capsys.readouterr().err
    assert "invalid config: inference.tool_call_parser: unknown tool-call parser 'qwen3-coder'" in err
    assert "did you mean qwen3_coder?" in err
    for name in ("auto", "hermes", "qwen3_coder", "llama3_json", "mistral"):
        assert (
            main(["check-config", path, "--no-devices", "--set", f"inference.tool_call_parser={name!r}"]) == 0
        )


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ("memroy_mb=256", "memroy_mb", "takes no option 'memroy_mb' (did you mean memory_mb?)"),
        ("memory_mb=0", "memory_mb", "must be > 0"),
        ("bwrap='no-such-bwrap'", "bwrap", "is not on PATH"),
    ],
)
def test_a_sandbox_runtime_option_is_named_in_the_finding(override, field, message):
    text = finding(
        f"orchestrator.train.env.0.runtime={{type = 'local', {override}}}", path="code_sandbox.toml"
    )
    assert text.startswith(f"orchestrator.train.env.0.runtime.{field}: ") and message in text


def test_a_runtime_for_an_env_that_runs_no_commands_is_refused():
    text = finding("orchestrator.train.env.0.runtime={type = 'local'}")
    assert text.startswith("orchestrator.train.env.0.runtime.type: ") and "runs no commands" in text
