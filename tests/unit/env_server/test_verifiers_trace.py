"""verifiers trace -> rlrun Trace (services/env_server/envs/verifiers/env.py) on real verifiers
objects: a trace built by verifiers' own graph (`prepare_turn` + `PendingTurn.commit`) from
train-client responses (`response_from_generate`) whose prompts the `renderers` renderer over the
shipped tokenizer folder rendered, so the nodes carry the renderer's token attribution."""

import importlib
import math
from pathlib import Path

import pytest

vf = importlib.import_module("verifiers.v1")
renderers = importlib.import_module("renderers")
transformers = importlib.import_module("transformers")

from verifiers.v1.clients.train import response_from_generate  # noqa: E402
from verifiers.v1.graph import prepare_turn  # noqa: E402
from verifiers.v1.trace import AgentInfo, ModelCall, TraceTask  # noqa: E402

from rlrun.common.wire.trace import (  # noqa: E402
    TaskRef,  # noqa: E402
    trace_from_proto,
    trace_to_proto,
)
from rlrun.env_server.envs.verifiers.env import convert_episode, convert_trace  # noqa: E402

FOLDER = Path(__file__).resolve().parents[3] / "configs/tokenizer/lowercase"
REF = TaskRef(env="vf-reverse", split="train", idx=3, example_id="abc", data='{"text":"abc"}')


TOKENIZER = transformers.AutoTokenizer.from_pretrained(str(FOLDER))


@pytest.fixture(scope="module")
def renderer():
    return renderers.create_renderer(TOKENIZER, renderers.DefaultRendererConfig())


def new_trace(name: str = "agent", trainable: bool = True):
    return vf.Trace(
        task=TraceTask(type="ReverseTask", data={"prompt": "abc"}),
        agent=AgentInfo(config=vf.AgentConfig(), name=name, trainable=trainable),
    )


def turn(trace, renderer, prompt, completion: str, logprobs: list[float], finish: str = "stop"):
    """One model turn as the train client commits it: the renderer renders the prompt, the
    completion's ids are the tokenizer's plus the end token."""
    messages = [
        vf.UserMessage(content=m[1]) if m[0] == "user" else vf.AssistantMessage(content=m[1]) for m in prompt
    ]
    pending = prepare_turn(trace, messages)
    rendered = renderer.render([{"role": r, "content": c} for r, c in prompt], add_generation_prompt=True)
    ids = TOKENIZER.encode(completion, add_special_tokens=False) + ([1] if finish == "stop" else [])
    assert len(ids) == len(logprobs)
    result = {
        "prompt_ids": rendered.token_ids,
        "completion_ids": ids,
        "completion_logprobs": logprobs,
        "prompt_attribution": rendered,
        "content": completion,
        "finish_reason": finish,
    }
    return pending.commit(response_from_generate(result, "reverse_text"))


def two_branch_trace(renderer):
    """user, assistant, user (feedback), assistant; and a second branch that rewrites the
    feedback (a new user message under the first answer)."""
    trace = new_trace()
    turn(trace, renderer, [("user", "abc")], "cb", [-0.5, -0.25, -0.125])
    turn(
        trace,
        renderer,
        [("user", "abc"), ("assistant", "cb"), ("user", "again")],
        "cba",
        [-1.0, -0.5, -0.2, -0.1],
    )
    turn(
        trace,
        renderer,
        [("user", "abc"), ("assistant", "cb"), ("user", "retry")],
        "c",
        [-2.0, -0.3],
        finish="stop",
    )
    trace.record_reward("similarity", 0.75, weight=2.0)
    trace.record_reward("format", 1.0)
    trace.record_metric("answer_chars", 3)
    trace.metrics["unscored"] = None
    trace.ok = True
    trace.stop("agent_completed")
    return trace


def test_every_branch_is_the_exact_sequence_verifiers_trains(renderer):
    vf_trace = two_branch_trace(renderer)
    assert len(vf_trace.branches) == 2 and len(vf_trace.nodes) == 6
    trace = convert_trace(vf_trace, "g/0", "g", REF, (4, 5))
    trace.validate()
    assert [n.id for n in trace.nodes] == [f"n{i}" for i in range(6)]
    assert [n.parent for n in trace.nodes] == [
        None if n.parent is None else f"n{n.parent}" for n in vf_trace.nodes
    ]
    for index, vf_branch in enumerate(vf_trace.branches):
        tokens = trace.branch_tokens(index)
        assert tokens.token_ids == vf_branch.token_ids
        assert tokens.sampled_mask == vf_branch.sampled_mask
        assert tokens.logprobs == vf_branch.logprobs
        # what the model saw at its last turn: the rendered prompt, then the completion
    last = trace.branch_tokens(1)
    assert last.token_ids[: last.sampled_mask.index(True)][-1] == 4  # the <|assistant|> header, not sampled
    assert sum(last.sampled_mask) == 3 + 2


def test_roles_observations_content_and_scores(renderer):
    trace = convert_trace(two_branch_trace(renderer), "g/0", "g", REF, (4, 5))
    assert [n.role for n in trace.nodes] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert [n.is_observation for n in trace.nodes] == [False, False, True, False, True, False]
    assert [n.content for n in trace.nodes] == ["abc", "cb", "again", "cba", "retry", "c"]
    assert {k: (c.score, c.weight) for k, c in trace.rewards.items()} == {
        "similarity": (0.75, 2.0),
        "format": (1.0, 1.0),
    }
    assert math.isclose(trace.reward, 2.5)
    assert trace.metrics["answer_chars"] == 3.0 and "unscored" not in trace.metrics
    assert trace.metrics["completion_tokens"] == 3 + 4 + 2 and trace.metrics["assistant_turns"] == 3
    assert trace.policy_span == (4, 5) and trace.stop_condition == "completed" and not trace.errors
    assert (trace.id, trace.rollout_id, trace.group_id, trace.member_id) == ("g/0", "g/0", "g", "policy")


def test_the_converted_trace_survives_the_wire(renderer):
    trace = convert_trace(two_branch_trace(renderer), "g/0", "g", REF, (4, 5))
    back = trace_from_proto(trace_to_proto(trace))
    back.validate()
    # the wire carries logprobs as float32 (as inference returns them); everything else exactly
    for sent, got in zip(trace.nodes, back.nodes, strict=True):
        assert got.logprobs == pytest.approx(sent.logprobs, rel=1e-7)
        got.logprobs = sent.logprobs
    assert back.nodes == trace.nodes and back.branches == trace.branches
    assert back.rewards == trace.rewards and back.policy_span == (4, 5)


def test_a_length_finish_is_truncated(renderer):
    vf_trace = new_trace()
    node = turn(vf_trace, renderer, [("user", "abc")], "cbaa", [-0.1] * 4, finish="length")
    vf_trace.calls.append(ModelCall(node=node, finish_reason="length"))  # as the interception records it
    vf_trace.record_reward("similarity", 0.5)
    vf_trace.ok = True
    vf_trace.stop("agent_completed")
    trace = convert_trace(vf_trace, "r", "g", REF, (0, 0))
    assert trace.is_truncated and trace.stop_condition == "length"
    assert trace.nodes[-1].token_ids[-1] != 1  # no end token: cut at max_tokens


def test_a_failed_trace_carries_its_error_and_no_reward(renderer):
    vf_trace = new_trace()
    turn(vf_trace, renderer, [("user", "abc")], "c", [-0.1, -0.1])
    vf_trace.record_error(vf.ProviderError("upstream 503", status_code=503))
    trace = convert_trace(vf_trace, "r", "g", REF, (1, 1))
    trace.validate()
    assert trace.stop_condition == "error" and trace.rewards == {} and trace.reward == 0.0
    assert [(e.type, e.retryable) for e in trace.errors] == [("ProviderError", True)]
    vf_trace = new_trace()
    vf_trace.record_error(vf.TaskError("the reward function raised"))
    assert convert_trace(vf_trace, "r", "g", REF, (1, 1)).errors[0].retryable is False


def episode(*traces, errors=()):
    ep = vf.Episode(task=TraceTask(type="ReverseTask", data={"prompt": "abc"}))
    ep.traces.extend(traces)
    ep.errors.extend(errors)
    return ep


def test_episodes_map_to_one_trace_per_rollout(renderer):
    ok = two_branch_trace(renderer)
    judge = two_branch_trace(renderer)
    judge.agent.trainable = False
    trace = convert_episode(episode(ok, judge), "g/1", "g", REF, (2, 3))
    assert not trace.errors and len(trace.branches) == 2  # the untrainable judge is left out
    two = convert_episode(episode(ok, two_branch_trace(renderer)), "g/1", "g", REF, (2, 3))
    assert two.errors[0].type == "UnsupportedEpisode" and two.stop_condition == "error"
    failed = convert_episode(
        episode(errors=[vf.Error(type="EnvError", message="run() raised")]), "g/1", "g", REF, (0, 0)
    )
    failed.validate()
    assert [(e.type, e.message) for e in failed.errors] == [("EnvError", "run() raised")]
