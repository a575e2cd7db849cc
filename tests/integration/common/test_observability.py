"""Metrics endpoint, structured logging and the ready line."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from rlrun.common.grpc_server import announce_ready
from rlrun.common.logs import setup_logging
from rlrun.common.metrics import metric_name, start_metrics_server, stop_metrics_server


def test_metrics_server_serves_registered_counter():
    registry = CollectorRegistry()
    counter = Counter(metric_name("test", "widgets", "total"), "Widgets made.", registry=registry)
    counter.inc(3)
    port = start_metrics_server(0, registry=registry)
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            body = reply.read().decode()
        assert "rlrun_test_widgets_total 3.0" in body
    finally:
        stop_metrics_server(port)


def test_metric_name():
    assert metric_name("inference", "generated_tokens", "total") == "rlrun_inference_generated_tokens_total"
    assert metric_name("env-server", "rollout", "seconds") == "rlrun_env_server_rollout_seconds"
    with pytest.raises(ValueError):
        metric_name("Trainer", "step", "seconds")


def test_announce_ready_prints_one_line(capsys):
    announce_ready("inference", "127.0.0.1", 50051)
    out, err = capsys.readouterr()
    assert out == "rlrun inference listening on 127.0.0.1:50051\n"
    assert err == ""


def test_setup_logging_writes_json_lines_and_is_idempotent(tmp_path, capsys):
    log_file = tmp_path / "logs" / "svc.jsonl"
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        setup_logging("trainer", log_file, level="debug")
        logger = setup_logging("trainer", log_file, level="DEBUG")
        assert logger.name == "rlrun.trainer"
        logger.info("step done", extra={"step": 3, "loss": 0.5})
        try:
            raise RuntimeError("nope")
        except RuntimeError:
            logging.getLogger("rlrun.trainer.loop").exception("failed")
        for handler in root.handlers:
            handler.flush()
        lines = log_file.read_text().splitlines()
        assert len(lines) == 2  # one handler only, despite two setup calls
        first, second = (json.loads(line) for line in lines)
        assert first["msg"] == "step done" and first["level"] == "INFO"
        assert first["service"] == "trainer" and first["logger"] == "rlrun.trainer"
        assert first["step"] == 3 and first["loss"] == 0.5 and first["ts"].endswith("Z")
        assert second["level"] == "ERROR" and "RuntimeError: nope" in second["exc"]
        err = capsys.readouterr().err
        assert err.count("step done") == 1
        assert "[trainer] rlrun.trainer: step done step=3 loss=0.5" in err
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
