"""[limits]: each unset limit derived from the run file so that the run never meets its own
limits, a set one kept, and every request that sizes work refused past them naming the field
and the limit, before any of its items is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrun.common.config import ConfigError, load_config
from rlrun.common.wire import WireError
from rlrun.common.wire.env import run_algorithms_request_from_proto, run_group_request_from_proto
from rlrun.common.wire.inference import chat_messages_from_proto, tokenize_request_from_proto
from rlrun.common.wire.trainer import submit_request_from_proto
from rlrun.v1 import env_pb2, inference_pb2, trace_pb2, trainer_pb2, training_pb2

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs/reverse_text.toml"


def test_derived_limits_cover_everything_the_run_itself_asks_for():
    config = load_config(DEMO, ["orchestrator.eval.pass_k=16", "orchestrator.eval.greedy=false"])
    limits = config.request_limits()
    orch = config.orchestrator
    assert limits.max_group_size >= max(orch.group_size, orch.eval.pass_k)
    assert limits.max_batch_samples >= orch.batch_size * orch.group_size
    assert limits.max_batch_samples >= orch.warm_start.batch_size
    assert max(orch.group_size, config.inference.max_batch_size) <= limits.max_samples
    assert limits.max_samples <= config.inference.max_waiting
    assert limits.max_messages >= 1 and limits.max_text_chars >= config.model.max_model_len
    # ... and still bound them: far below what a hostile request asks.
    assert limits.max_group_size < 2**31 - 1


def test_a_limit_set_in_the_run_file_is_kept_and_one_no_queue_could_hold_is_refused():
    assert load_config(DEMO, ["limits.max_group_size=5"]).request_limits().max_group_size == 5
    with pytest.raises(ConfigError, match="limits.max_samples"):
        load_config(DEMO, ["limits.max_samples=5000", "inference.max_waiting=4096"])


def refused(call) -> WireError:
    with pytest.raises(WireError) as caught:
        call()
    return caught.value


def test_requests_over_a_limit_are_refused_naming_the_field_and_the_limit():
    limits = load_config(DEMO, ["limits.max_group_size=4"]).request_limits()
    error = refused(lambda: run_group_request_from_proto(env_pb2.RunGroupRequest(n=5), limits))
    assert (error.field, error.message) == ("n", "5 rollouts exceed the limit limits.max_group_size = 4")
    traces = [trace_pb2.Trace() for _ in range(9)]
    request = env_pb2.RunAlgorithmsRequest(env_id="debate", traces=traces)
    assert refused(lambda: run_algorithms_request_from_proto(request, limits)).field == "traces"
    # Three members: nine traces are three per member, within the limit, so the traces are
    # read (and these empty ones refused, the first by its id).
    assert refused(lambda: run_algorithms_request_from_proto(request, limits, {"debate": 3})).field == (
        "traces[0].id"
    )

    messages = [inference_pb2.ChatMessage(role="user", content="a")] * (limits.max_messages + 1)
    assert refused(lambda: chat_messages_from_proto(messages, limits)).field == "messages"
    long = [inference_pb2.ChatMessage(role="user", content="a" * (limits.max_text_chars + 1))]
    assert refused(lambda: chat_messages_from_proto(long, limits)).field == "messages[0].content"
    text = inference_pb2.TokenizeRequest(text="a" * (limits.max_text_chars + 1))
    assert refused(lambda: tokenize_request_from_proto(text, limits)).field == "text"

    samples = [training_pb2.TrainingSample()] * (limits.max_batch_samples + 1)
    batch = trainer_pb2.SubmitBatchRequest(batch=training_pb2.TrainingBatch(samples=samples))
    error = refused(lambda: submit_request_from_proto(batch, limits=limits))
    assert error.field == "batch.samples" and "limits.max_batch_samples" in str(error.message)
