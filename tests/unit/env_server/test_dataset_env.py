"""The built-in `dataset` env (issue 33 item 4): rows from real local files (JSONL, JSON, CSV,
Parquet) and, offline, from a Hugging Face datasets id; the prompt template, the scorers and
the splits."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlrun.env_server.envs.dataset import DatasetEnv, read_rows
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.sdk.task import Task

from ...support.hf_cache import REPO, hub_env, trap_fixture  # noqa: F401

ROWS = [{"id": i, "a": i, "b": i + 1, "answer": str(2 * i + 1), "note": "x"} for i in range(40)]


class Done:
    """The bits of an Episode a scorer reads."""

    def __init__(self, answer: str):
        self.answer = answer


def write(path: Path, rows=ROWS) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def all_tasks(env) -> list[Task]:
    return [env.taskset.get(split, i) for split, n in env.taskset.sizes.items() for i in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_rows_from_each_file_format_become_tasks_with_the_template(tmp_path, suffix):
    path = write(tmp_path / f"data{suffix}")
    env = make_env("dataset", {"path": str(path), "prompt": "{a}+{b}=", "id_column": "id"})
    sizes = env.taskset.sizes
    assert sizes["train"] + sizes["eval"] == 40 and sizes["eval"] > 0 and sizes["train"] > 0
    by_prompt = {t.prompt: t for t in all_tasks(env)}
    task = by_prompt["3+4="]
    assert task.data["answer"] == "7" and str(task.example_id) == "3"
    assert env.reference_answer(task) == "7"


def test_the_split_is_disjoint_stable_and_the_same_for_every_format(tmp_path):
    keys = {}
    for suffix in (".jsonl", ".csv"):
        env = DatasetEnv(path=str(write(tmp_path / f"d{suffix}")), prompt="{a}+{b}=", id_column="id")
        train = {t.example_id for t in all_tasks(env) if t.split == "train"}
        held = {t.example_id for t in all_tasks(env) if t.split == "eval"}
        assert not train & held
        keys[suffix] = held
    assert keys[".jsonl"] == keys[".csv"]


def test_an_eval_file_is_the_eval_split(tmp_path):
    train, held = write(tmp_path / "train.jsonl"), write(tmp_path / "eval.csv", ROWS[:5])
    env = DatasetEnv(path=str(train), eval_path=str(held), prompt="{a}+{b}=")
    assert env.taskset.sizes == {"train": 40, "eval": 5}
    assert env.taskset.get("eval", 4).prompt == "4+5="


def test_max_rows_and_a_system_template(tmp_path):
    env = DatasetEnv(
        path=str(write(tmp_path / "d.jsonl")),
        prompt="{a}+{b}=",
        system="note: {note}",
        max_rows=10,
        eval_buckets=1000,
    )
    assert env.taskset.sizes["train"] + env.taskset.sizes["eval"] == 10
    assert env.taskset.get("train", 0).system == "note: x"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"prompt": "{question}"}, "names column 'question'"),
        ({"prompt": "{a}", "answer": "solution"}, "`answer` names column 'solution'"),
        ({"prompt": "{}"}, "name the column"),
        ({"prompt": "{a}", "scorer": "nope"}, "unknown scorer 'nope'"),
        ({"prompt": "{a}", "scorer": "regex", "scorer_args": {"patern": "x"}}, "bad scorer_args ['patern']"),
    ],
)
def test_a_misconfigured_dataset_fails_at_construction_naming_what(tmp_path, args, message):
    with pytest.raises(ValueError, match="dataset|scorer|template|column") as error:
        DatasetEnv(path=str(write(tmp_path / "d.jsonl")), **args)
    assert message in str(error.value)


def test_exactly_one_source_and_a_missing_file_are_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        DatasetEnv()
    with pytest.raises(ValueError, match="does not exist"):
        DatasetEnv(path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown format"):
        read_rows(tmp_path / "d.txt")


def score(env, task, answer: str) -> float:
    return env.score(task, Done(answer)).reward


def test_scorers_exact_regex_math_and_a_callable(tmp_path):
    rows = [{"q": "half", "answer": "1/2"}, {"q": "ratio", "answer": "\\frac{3}{4}"}]
    path = write(tmp_path / "m.jsonl", rows)

    def env(scorer, **scorer_args):
        e = DatasetEnv(
            path=str(path), prompt="{q}", scorer=scorer, scorer_args=scorer_args, eval_buckets=1000
        )
        return e, {t.prompt: t for t in all_tasks(e)}

    exact, tasks = env("exact")
    assert score(exact, tasks["half"], " 1/2 ") == 1.0 and score(exact, tasks["half"], "0.5") == 0.0
    math_env, tasks = env("math")
    assert score(math_env, tasks["half"], "0.5") == 1.0
    assert score(math_env, tasks["half"], "The answer is $\\frac{1}{2}$") == 1.0
    assert score(math_env, tasks["ratio"], "0.75") == 1.0
    assert score(math_env, tasks["ratio"], "0.7") == 0.0
    regex, tasks = env("regex", pattern=r"answer: {answer}\b", ignore_case=True)
    assert score(regex, tasks["half"], "so ANSWER: 1/2.") == 1.0 and score(regex, tasks["half"], "1/2") == 0.0
    default_regex, tasks = env("regex")
    assert (
        score(default_regex, tasks["half"], "  1/2\n") == 1.0
        and score(default_regex, tasks["half"], "1/23") == 0.0
    )
    similarity, tasks = env("rlrun.env_server.sdk.scoring:similarity")
    assert score(similarity, tasks["half"], "1/3") == pytest.approx(2 / 3)
    named, tasks = env(f"{__name__}:row_aware")
    reward = named.score(tasks["half"], Done("1/2"))
    assert set(reward.rewards) == {"right", "short"} and reward.reward == 2.0


def row_aware(answer: str, target: str, row: dict) -> dict[str, float]:
    assert row["q"] in ("half", "ratio")
    return {"right": float(answer == target), "short": float(len(answer) < 5)}


HF_LOAD = """
import json, sys
from rlrun.env_server.envs.dataset import DatasetEnv
env = DatasetEnv(hf_id=sys.argv[1], eval_split="test", prompt="{a}+{b}=")
print(json.dumps({"sizes": env.taskset.sizes, "prompt": env.taskset.get("eval", 1).prompt}))
"""


def test_a_hugging_face_dataset_id_loads_offline_through_the_cache(tmp_path, trap):
    """A dataset folder in the Hub's layout (data/train.jsonl, data/test.jsonl), loaded by
    `datasets` with HF_DATASETS_OFFLINE and the Hub endpoint pointed at a socket that counts
    connections: none is made, and the second load comes from the datasets cache."""
    repo = tmp_path / "my-dataset"
    (repo / "data").mkdir(parents=True)
    write(repo / "data" / "train.jsonl")
    write(repo / "data" / "test.jsonl", ROWS[:3])
    env = hub_env(tmp_path / "hf", trap) | {
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
    }
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", HF_LOAD, str(repo)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.splitlines()[-1]) == {
            "sizes": {"train": 40, "eval": 3},
            "prompt": "1+2=",
        }
    assert trap.connections == 0
    assert any((tmp_path / "cache").iterdir())
