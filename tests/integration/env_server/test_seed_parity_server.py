"""Seed-parity behaviours of the built-in env-server (issue 34), through a real
`rlrun serve env-server` process: RunAlgorithms with algorithm settings and model endpoints
(a reference model's Score), the harness chosen per env entry, and the setup phase of a
trace's timing."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import pytest
from env_test_servers import serve_builtin
from env_test_support import last_message

from rlrun.common.wire.trace import trace_from_proto
from rlrun.v1 import env_pb2, inference_pb2, inference_pb2_grpc, plan_pb2

ENVS = """
[[orchestrator.train.env]]
id = "seed_parity_envs:RefScoredEnv"
name = "ref-scored"
[[orchestrator.train.env]]
id = "seed_parity_envs:SlowSetupEnv"
name = "slow-setup"
[[orchestrator.train.env]]
id = "alphabet-sort"
name = "sort-default"
[[orchestrator.train.env]]
id = "alphabet-sort"
name = "sort-multi-turn"
harness = { id = "multi-turn", args = { max_turns = 2 } }
[[orchestrator.train.env]]
id = "tool-calc"
name = "calc-single-turn"
harness = { id = "single-turn" }
"""
REFERENCE_LOGPROB = -0.75


class ReferenceModel(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self):
        self.requests: list[inference_pb2.ScoreRequest] = []

    def Score(self, request, context):
        self.requests.append(request)
        return inference_pb2.ScoreResponse(
            logprobs=[REFERENCE_LOGPROB] * (len(request.token_ids) - request.start)
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = serve_builtin(tmp_path_factory.mktemp("seed-parity"), ENVS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = ReferenceModel()
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def run_group(server, env: str, address: str, n: int = 2, idx: int = 0):
    plan = plan_pb2.GenerationPlan(
        targets=[
            plan_pb2.PlanTarget(
                member_id="policy",
                role=plan_pb2.MEMBER_ROLE_TRAIN,
                model=plan_pb2.ModelEndpoint(
                    name="policy", kind=plan_pb2.ENDPOINT_KIND_INFERENCE, addresses=[address]
                ),
                sampling={"temperature": 1.0, "max_tokens": 12},
            )
        ]
    )
    request = env_pb2.RunGroupRequest(
        group_id=f"{env}-{idx}", task={"env": env, "split": "train", "idx": idx}, plan=plan, n=n
    )
    return server.stub.RunGroup(request, timeout=60).traces


def test_run_algorithms_gets_its_settings_and_scores_with_the_reference(
    server, reference, inference, inference_server
):
    servicer, address = reference
    traces = run_group(server, "ref-scored", inference_server.address, n=2)
    reply = server.stub.RunAlgorithms(
        env_pb2.RunAlgorithmsRequest(
            env_id="ref-scored",
            algorithms=["ref_gap"],
            traces=traces,
            algorithm_args={"ref_gap": json.dumps({"coef": 2.0})},
            models=[
                plan_pb2.ModelEndpoint(
                    name="reference", kind=plan_pb2.ENDPOINT_KIND_INFERENCE, addresses=[address]
                )
            ],
        ),
        timeout=60,
    )
    assert len(servicer.requests) == 2
    by_id = {t.id: trace_from_proto(t) for t in traces}
    assert len(reply.results) == 2
    for result in reply.results:
        tokens = by_id[result.trace_id].branch_tokens(0)
        expected = [
            2.0 * (REFERENCE_LOGPROB - lp) if sampled else 0.0
            for lp, sampled in zip(tokens.logprobs, tokens.sampled_mask, strict=True)
        ]
        assert list(result.channels[0].values) == pytest.approx(expected)
        assert any(v != 0 for v in expected)
    scored = servicer.requests[0]
    assert list(scored.token_ids) in [by_id[t].branch_tokens(0).token_ids for t in by_id]


def test_run_algorithms_without_the_model_endpoint_fails_naming_it(server, inference, inference_server):
    traces = run_group(server, "ref-scored", inference_server.address, n=1)
    with pytest.raises(grpc.RpcError) as error:
        server.stub.RunAlgorithms(
            env_pb2.RunAlgorithmsRequest(env_id="ref-scored", algorithms=["ref_gap"], traces=traces),
            timeout=60,
        )
    assert "model 'reference'" in error.value.details()


def test_malformed_algorithm_args_are_an_invalid_argument(server, inference, inference_server):
    traces = run_group(server, "ref-scored", inference_server.address, n=1)
    with pytest.raises(grpc.RpcError) as error:
        server.stub.RunAlgorithms(
            env_pb2.RunAlgorithmsRequest(
                env_id="ref-scored", algorithms=["ref_gap"], traces=traces, algorithm_args={"ref_gap": "[1]"}
            ),
            timeout=60,
        )
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "algorithm_args[ref_gap]" in error.value.details()


def roles(trace) -> list[str]:
    return [node.role for node in trace_from_proto(trace).nodes]


def test_the_harness_is_chosen_per_env_entry(server, inference, inference_server):
    inference.policy = lambda tok, prompt: "zz"  # never sorted: feedback follows when there is a next turn
    [default] = run_group(server, "sort-default", inference_server.address, n=1)
    assert roles(default).count("assistant") == 1
    [multi] = run_group(server, "sort-multi-turn", inference_server.address, n=1)
    assert roles(multi).count("assistant") == 2 and roles(multi).count("user") == 2
    assert trace_from_proto(multi).metrics["turns"] == 2

    inference.policy = lambda tok, prompt: "calc(2*3)" if "calc" not in last_message(tok, prompt) else "6"
    [single] = run_group(server, "calc-single-turn", inference_server.address, n=1)
    single_trace = trace_from_proto(single)
    assert "tool" not in roles(single) and single_trace.stop_condition == "completed"
    assert single_trace.nodes[-1].content == "calc(2*3)"  # the answer, not a tool call


def test_trace_timing_has_a_setup_phase(server, inference, inference_server):
    traces = [trace_from_proto(t) for t in run_group(server, "slow-setup", inference_server.address, n=2)]
    for trace in traces:
        assert trace.timing["setup_s"] >= 0.3
        assert trace.timing["generation_s"] < 0.3
        assert trace.timing["total_s"] >= trace.timing["setup_s"]
