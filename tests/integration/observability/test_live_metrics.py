"""The chart's dashboards and alerts against live services: a short `rlrun local` run, scraped
by a real Prometheus (127.0.0.1, 1 s, its targets from the run's prometheus_targets.json) and by
the test itself. Every metric name a dashboard query, variable or alert reads (found by parsing
the PromQL) is one a service exports; every panel query returns data through Prometheus's HTTP
API; no alert fires on this healthy run. The run also has `[monitor]` on (TensorBoard and W&B
offline), read back from its event files and W&B's offline run folder."""

from __future__ import annotations

import glob
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ...chart.monitoring import (
    REPO,
    family,
    grafana_to_promql,
    metric_names,
    prometheus_binaries,
    queries,
    rule_spec,
)
from ...chart.test_monitoring import free_port, get_json, run_prometheus

importlib.import_module("helm_python")

CONFIG = REPO / "configs" / "reverse_text.toml"
RUN = "reverse_text"  # the config's name: the `run` label
RL_STEPS = 12  # steps after Prometheus picks up the targets (its scrape manager applies them within ~5 s), so every rate() sees increases


class Scraper(threading.Thread):
    """Scrapes every target of prometheus_targets.json as soon as it appears, until stopped;
    keeps each service's last /metrics text."""

    def __init__(self, targets_file: Path):
        super().__init__(daemon=True)
        self.targets_file, self.texts, self.stop = targets_file, {}, threading.Event()

    def run(self):
        while not self.stop.wait(0.5):
            if not self.targets_file.exists():
                continue
            for entry in json.loads(self.targets_file.read_text()):
                for target in entry["targets"]:
                    try:
                        with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as r:
                            self.texts[entry["labels"]["service"]] = r.read().decode()
                    except OSError:
                        pass


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    _, prometheus = prometheus_binaries()
    folder = tmp_path_factory.mktemp("observability")
    out = folder / "run"
    out.mkdir()
    (folder / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(folder / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "rlrun",
                "file_sd_configs": [
                    {"files": [str(out / "prometheus_targets.json")], "refresh_interval": "1s"}
                ],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = f"127.0.0.1:{free_port()}"
    with run_prometheus(prometheus, folder, web):
        scraper = Scraper(out / "prometheus_targets.json")
        scraper.start()
        started = time.time()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
        sets = [
            "orchestrator.warm_start.max_steps=2",
            "orchestrator.eval.num_tasks=16",
            "monitor.tensorboard.enabled=true",
            "monitor.wandb.enabled=true",
            "monitor.samples_interval=1",
            "monitor.num_samples=4",
        ]
        result = subprocess.run(
            [sys.executable, "-m", "rlrun.cli", "local", str(CONFIG), "--output-dir", str(out)]
            + ["--max-steps", str(RL_STEPS), "--no-progress"]
            + [arg for s in sets for arg in ("--set", s)],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=REPO,
            env=env,
        )
        scraper.stop.set()
        scraper.join()
        assert result.returncode == 0, result.stderr[-3000:]
        time.sleep(3)  # the last scrapes and rule evaluations
        yield {"web": web, "start": started, "end": time.time(), "out": out, "texts": scraper.texts}


def query_range(live, expr: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": live["start"], "end": live["end"], "step": "1"})
    body = get_json(f"http://{live['web']}/api/v1/query_range?{params}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def exported(live) -> dict[str, set[str]]:
    """Sample names (x_bucket, x_total, ...) each service's /metrics served, by family too."""
    names: dict[str, set[str]] = {}
    for service, text in live["texts"].items():
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                names.setdefault(sample.name, set()).add(service)
    return names


def test_every_service_is_a_target_with_the_labels_the_dashboards_filter_on(live):
    targets = json.loads((live["out"] / "prometheus_targets.json").read_text())
    services = {t["labels"]["service"] for t in targets}
    assert {"inference", "trainer", "orchestrator"} <= services and any(
        s.startswith("env-server-") for s in services
    )
    assert set(live["texts"]) == services  # each served /metrics during the run
    up = query_range(live, f'max by (service) (max_over_time(up{{namespace="local", run="{RUN}"}}[1m]))')
    assert {r["metric"]["service"] for r in up if any(v == "1" for _, v in r["values"])} == services


def test_every_name_the_dashboards_and_alerts_read_is_exported_by_a_service(live):
    names = exported(live)
    families = {family(n, set()) for n in names}
    used = {(q.where, n) for q in queries() for n in metric_names(q.expr)}
    assert used  # parsed from every dashboard query, variable and alert expression
    missing = sorted((where, n) for where, n in used if n not in names and n not in families)
    assert not missing, missing


def test_every_dashboard_panel_query_returns_data_from_the_run(live):
    empty = []
    for q in queries(rules=[]):
        expr = grafana_to_promql(q.expr, namespace="local", run=RUN, rate_interval="30s")
        if q.panel:
            result = query_range(live, expr)
            if not any(math.isfinite(float(v)) for r in result for _, v in r["values"]):
                empty.append((q.where, expr))
        else:  # a variable: label_values(selector, label) lists this run
            params = urllib.parse.urlencode({"match[]": expr, "start": live["start"], "end": live["end"]})
            series = get_json(f"http://{live['web']}/api/v1/series?{params}")["data"]
            if not any(s.get("run") == RUN and s.get("namespace") == "local" for s in series):
                empty.append((q.where, expr))
    assert not empty, empty


def test_no_alert_fires_on_a_healthy_run(live):
    rules = get_json(f"http://{live['web']}/api/v1/rules")["data"]["groups"]
    assert sum(len(g["rules"]) for g in rules) == len(rule_spec()["groups"][0]["rules"])
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    assert query_range(live, 'ALERTS{alertstate="firing"}') == []


# --- [monitor]: TensorBoard and W&B offline ----------------------------------------------------


def wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`): W&B's LevelDB-style log of
    wandb_internal_pb2.Record messages (7-byte file header, 32 KiB blocks, 7-byte chunk headers)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or its last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def metrics_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def expected_scalars(out: Path) -> dict[tuple[str, int], float]:
    expected = {}
    for line in metrics_lines(out):
        for key, value in line.items():
            if key in ("step", "trainer_step", "phase", "time") or isinstance(
                value, bool
            ):  # time: the wall clock
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                expected[(f"{line['phase']}/{key}", line["trainer_step"])] = float(value)
    return expected


def test_tensorboard_event_files_hold_every_metrics_line_and_the_sample_tables(live):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(live["out"] / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    logged = {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    expected = expected_scalars(live["out"])
    assert expected and set(expected) <= set(logged)
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    rl = {line["trainer_step"]: line["step"] for line in metrics_lines(live["out"]) if line["phase"] == "rl"}
    tables = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("samples/rollouts")}
    assert set(tables) == set(rl)
    for trainer_step, table in tables.items():
        header, _, *rows = table.splitlines()
        assert header == "| step | env | prompt | completion | reward |"
        assert len(rows) == 4
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            assert cells[0] == str(rl[trainer_step]) and cells[1] == "reverse-text"
            assert cells[2] and 0.0 <= float(cells[4]) <= 1.0


def test_wandb_offline_run_holds_every_metrics_line_and_the_sample_tables(live):
    (run_dir,) = glob.glob(str(live["out"] / "wandb" / "offline-run-*"))
    (run_file,) = Path(run_dir).glob("run-*.wandb")
    history = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history.setdefault(row["_step"], {}).update(row)
    for (key, step), value in expected_scalars(live["out"]).items():
        assert history[step][key] == pytest.approx(value, rel=1e-6, abs=1e-6), (key, step)
    rl = [line for line in metrics_lines(live["out"]) if line["phase"] == "rl"]
    for line in rl:
        table_path = Path(run_dir) / "files" / history[line["trainer_step"]]["samples/rollouts/path"]
        table = json.loads(table_path.read_text())
        assert table["columns"] == ["step", "env", "prompt", "completion", "reward"]
        assert len(table["data"]) == 4
        assert all(r[0] == line["step"] and r[1] == "reverse-text" and r[2] for r in table["data"])
