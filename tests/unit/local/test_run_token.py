"""`rlrun local`'s run token: a fresh one per run, readable by its user alone, handed to every
service through the run file's `grpc.auth_token_file`; the run file's own token is kept; a run
with an external env-server gets none (that server could not know it), and says so."""

from __future__ import annotations

import stat
from pathlib import Path

from rlrun.common.config import load_config
from rlrun.common.grpc_server import read_token_file
from rlrun.local.launcher import secure_run

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs/reverse_text.toml"


def demo(tmp_path: Path, *overrides: str):
    overrides = (f'output_dir="{tmp_path / "run"}"', *overrides)
    config = load_config(DEMO, list(overrides))
    config.run_dir.mkdir(parents=True, exist_ok=True)
    return config, list(overrides)


def test_each_run_gets_a_fresh_token_only_its_user_can_read(tmp_path, capsys):
    config, overrides = demo(tmp_path)
    secured, sets = secure_run(config, overrides)
    token_file = secured.grpc.auth_token_file
    assert token_file is not None and token_file.parent == config.run_dir
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    first = read_token_file(token_file)
    assert first is not None and len(first) >= 32
    # What the services are started with loads to the same file.
    assert load_config(DEMO, sets).grpc.auth_token_file == token_file
    assert str(token_file) in capsys.readouterr().err
    token_file.chmod(0o644)  # a file left readable is not reused as it is
    again, _ = secure_run(config, overrides)
    assert read_token_file(again.grpc.auth_token_file) != first
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


def test_the_run_files_own_token_is_kept(tmp_path):
    mine = tmp_path / "my-token"
    mine.write_text("mine")
    config, overrides = demo(tmp_path, f'grpc.auth_token_file="{mine}"')
    secured, sets = secure_run(config, overrides)
    assert secured.grpc.auth_token_file == mine and sets == overrides


def test_a_run_with_an_external_env_server_gets_none_and_says_so(tmp_path, capsys):
    config, overrides = demo(tmp_path, 'orchestrator.train.env.0.address="127.0.0.1:1"')
    secured, sets = secure_run(config, overrides)
    assert secured.grpc.auth_token_file is None and sets == overrides
    assert "ask for no token" in capsys.readouterr().err
