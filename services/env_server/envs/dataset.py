"""dataset: tasks from a data file or a Hugging Face dataset, without writing an env.

Where the rows come from (exactly one):
- `path`: a local `.jsonl`, `.json` (a list of objects), `.csv` or `.parquet` file (Parquet
  needs `pyarrow`: the `datasets` extra);
- `hf_id` (+ `hf_config`, `hf_revision`): a Hugging Face datasets id, loaded through
  `datasets.load_dataset` into its cache (`HF_DATASETS_CACHE`; with `HF_DATASETS_OFFLINE=1`
  only the cache is read). Needs the `datasets` extra.

The prompt is `prompt` (a `str.format` template naming columns, e.g. "What is {a} + {b}?"),
with an optional `system` template; the target is the `answer` column (as text). Scorers
(`scorer`, with `scorer_args`):
- `exact` (default): the answer equals the target after stripping whitespace
  (`ignore_case = true` to fold case);
- `regex`: `pattern` is searched in the answer, `{answer}` in it standing for the escaped
  target (default pattern "^\\s*{answer}\\s*$"); `ignore_case`;
- `math`: numeric / mathematical equivalence of answer and target (`math-verify`: fractions,
  LaTeX, `\\boxed{}`, decimals; the `datasets` extra installs it);
- `package.module:function`: `function(answer, target)` returning a float (or a dict of named
  floats, summed), also given `row=` (the row as a dict) when it takes a `row` parameter; e.g.
  `rlrun.env_server:similarity` for partial credit.
The reward is named after the scorer (`exact`, `regex`, `math`, or the function's name).

Splits: `eval_path` (a file) or `eval_split` (a split of `hf_id`) is the eval split; without
either, the rows whose key hashes into the eval bucket (one in `eval_buckets`, stable across
processes and runs) are held out as eval and the rest train. A row's key is its `id_column`
value, else its rendered prompt. `max_rows` caps each split (the first rows) for quick runs.
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import math
import re
import string
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlrun.common.errors import did_you_mean
from rlrun.common.wire.trace import RewardComponent
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.scoring import exact_match
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import EVAL, TRAIN, Taskset, in_eval_bucket

Row = dict[str, Any]
EXTRA = "install rlrun's `datasets` extra (pip install 'rlrun[datasets]')"


# -- reading rows -------------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[Row]:
    """The rows of a local .jsonl, .json, .csv or .parquet file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    elif suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
    elif suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"reading {path} needs pyarrow: {EXTRA}") from None
        rows = pq.read_table(path).to_pylist()
    else:
        raise ValueError(
            f"dataset file {path}: unknown format {suffix!r}; use .jsonl, .json, .csv or .parquet"
        )
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"dataset file {path} must hold objects (one per row)")
    return rows


def load_hf_rows(hf_id: str, split: str, config: str | None, revision: str | None) -> list[Row]:
    """A split of a Hugging Face dataset, through `datasets` and its cache."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"dataset {hf_id!r} from the Hugging Face Hub needs `datasets`: {EXTRA}") from None
    try:
        data = datasets.load_dataset(hf_id, config, split=split, revision=revision)
    except Exception as error:
        raise ValueError(f"cannot load split {split!r} of dataset {hf_id!r}: {error}") from None
    return [dict(row) for row in data]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


# -- scorers ------------------------------------------------------------------------------------

Scorer = Callable[[str, str, Row], "float | dict[str, float]"]


def _exact(ignore_case: bool = False) -> Scorer:
    def score(answer: str, target: str, row: Row) -> float:
        if ignore_case:
            return exact_match(answer.casefold(), target.casefold())
        return exact_match(answer, target)

    return score


def _regex(pattern: str = r"^\s*{answer}\s*$", ignore_case: bool = False) -> Scorer:
    if "{answer}" not in pattern:
        re.compile(pattern)  # a bad pattern fails at construction
    flags = re.IGNORECASE if ignore_case else 0

    def score(answer: str, target: str, row: Row) -> float:
        compiled = re.compile(pattern.replace("{answer}", re.escape(target.strip())), flags)
        return 1.0 if compiled.search(answer) else 0.0

    return score


def _math() -> Scorer:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ValueError(f"scorer 'math' needs math-verify: {EXTRA}") from None

    def score(answer: str, target: str, row: Row) -> float:
        # math-verify bounds its work with SIGALRM, which only the main thread may use.
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        gold = parse(target, parsing_timeout=timeout)
        if not gold:
            gold = parse(f"${target}$", parsing_timeout=timeout)
        return 1.0 if verify(gold, parse(answer, parsing_timeout=timeout), timeout_seconds=timeout) else 0.0

    return score


def _callable(name: str, **args: Any) -> Scorer:
    module_name, _, attr = name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"scorer {name!r}: cannot import it: {error}") from None
    if not callable(function):
        raise ValueError(f"scorer {name!r} is not callable")
    takes_row = "row" in inspect.signature(function).parameters

    def score(answer: str, target: str, row: Row) -> float | dict[str, float]:
        return function(answer, target, row=row, **args) if takes_row else function(answer, target, **args)

    return score


BUILTIN_SCORERS: dict[str, Callable[..., Scorer]] = {"exact": _exact, "regex": _regex, "math": _math}


def make_scorer(name: str, args: dict[str, Any]) -> Scorer:
    if name in BUILTIN_SCORERS:
        factory = BUILTIN_SCORERS[name]
    elif ":" in name:
        return _callable(name, **args)
    else:
        raise ValueError(
            f"unknown scorer {name!r}{did_you_mean(name, BUILTIN_SCORERS)}; use one of "
            f"{sorted(BUILTIN_SCORERS)} or `package.module:function`"
        )
    try:
        return factory(**args)
    except TypeError as error:
        raise ValueError(f"scorer {name!r}: bad scorer_args {sorted(args)}: {error}") from None


# -- the taskset and the env --------------------------------------------------------------------


class RowTemplate:
    """Renders a row's prompt, system message and target; a column the templates name that a
    row lacks is an error naming it and the row's columns."""

    def __init__(self, prompt: str, answer: str, system: str | None, id_column: str | None):
        self.prompt, self.answer, self.system, self.id_column = prompt, answer, system, id_column
        for template in (prompt, system or ""):
            for _, field, _, _ in string.Formatter().parse(template):
                if field is not None and not field:
                    raise ValueError(f"template {template!r}: name the column in every {{}}")

    def example(self, row: Row, where: str) -> Example:
        def lacks(column: str, arg: str) -> ValueError:
            return ValueError(
                f"{where}: `{arg}` names column {column!r}, which the row lacks"
                f"{did_you_mean(column, row)} (columns: {', '.join(sorted(row))})"
            )

        for column, arg in ((self.answer, "answer"), (self.id_column, "id_column")):
            if column is not None and column not in row:
                raise lacks(column, arg)
        try:
            prompt = self.prompt.format_map(row)
        except KeyError as error:
            raise lacks(str(error.args[0]), "prompt") from None
        try:
            system = self.system.format_map(row) if self.system else None
        except KeyError as error:
            raise lacks(str(error.args[0]), "system") from None
        key = str(row[self.id_column]) if self.id_column else prompt
        data = {"answer": str(row[self.answer]).strip(), "row": _jsonable(row)}
        return Example(key=key, prompt=prompt, data=data, system=system)


class RowsTaskset(Taskset):
    def __init__(self, splits: dict[str, list[Example]]):
        self.splits = splits

    @property
    def sizes(self) -> dict[str, int]:
        return {split: len(examples) for split, examples in self.splits.items()}

    def get(self, split: str, idx: int) -> Task:
        if split not in self.splits:
            raise KeyError(f"unknown split {split!r}; expected one of {sorted(self.splits)}")
        examples = self.splits[split]
        if not 0 <= idx < len(examples):
            raise IndexError(f"{split} task {idx} is outside [0, {len(examples)})")
        return Task.from_example(split, idx, examples[idx])


class DatasetEnv(Environment):
    def __init__(
        self,
        path: str | None = None,
        hf_id: str | None = None,
        hf_config: str | None = None,
        hf_revision: str | None = None,
        train_split: str = "train",
        eval_split: str | None = None,
        eval_path: str | None = None,
        eval_buckets: int = 10,
        prompt: str = "{question}",
        system: str | None = None,
        answer: str = "answer",
        id_column: str | None = None,
        scorer: str = "exact",
        scorer_args: dict[str, Any] | None = None,
        max_rows: int | None = None,
    ):
        if (path is None) == (hf_id is None):
            raise ValueError("give exactly one of `path` (a local file) and `hf_id` (a Hugging Face dataset)")
        if eval_split is not None and hf_id is None:
            raise ValueError("`eval_split` names a split of `hf_id`; for a local file use `eval_path`")
        if eval_buckets < 2:
            raise ValueError(f"eval_buckets must be >= 2, got {eval_buckets}")
        template = RowTemplate(prompt, answer, system, id_column)

        def examples(rows: list[Row], source: str) -> list[Example]:
            rows = rows[:max_rows] if max_rows else rows
            return [template.example(row, f"{source} row {i}") for i, row in enumerate(rows)]

        if hf_id is not None:
            train = examples(
                load_hf_rows(hf_id, train_split, hf_config, hf_revision), f"{hf_id}[{train_split}]"
            )
        else:
            train = examples(read_rows(path), str(path))  # type: ignore[arg-type]
        if eval_path is not None:
            held_out = examples(read_rows(eval_path), eval_path)
        elif eval_split is not None:
            held_out = examples(
                load_hf_rows(hf_id, eval_split, hf_config, hf_revision), f"{hf_id}[{eval_split}]"
            )  # type: ignore[arg-type]
        else:
            held_out = [e for e in train if in_eval_bucket(e.key, eval_buckets)]
            train = [e for e in train if not in_eval_bucket(e.key, eval_buckets)]
        if not train:
            raise ValueError("the dataset has no train rows")
        self.taskset = RowsTaskset({TRAIN: train, EVAL: held_out})
        self.harness = SingleTurnHarness()
        self.scorer_name = scorer.rpartition(":")[2]  # the reward's name: `exact`, ..., or the function's
        self.scorer = make_scorer(scorer, dict(scorer_args or {}))

    def score(self, task: Task, episode: Episode) -> Score:
        value = self.scorer(episode.answer, task.data["answer"], task.data["row"])
        if isinstance(value, dict):
            return Score({name: RewardComponent(float(v), 1.0) for name, v in value.items()})
        return Score.of(self.scorer_name, float(value))

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]
