"""Message-graph invariants: a branch's tokens are exactly what the model saw, logprobs sit
only on sampled tokens, later turns extend the prefix, and rewriting history branches."""

from __future__ import annotations

import pytest

from rlrun.common.wire.inference import Completion
from rlrun.common.wire.trace import TaskRef, Trace
from rlrun.env_server.sdk.conversation import Conversation
from rlrun.env_server.sdk.trace_builder import TraceBuilder


def completion(tokenizer, text: str, logprob: float = -0.5, version: tuple[int, int] = (0, 0), finish="stop"):
    tokens = tokenizer.encode(text) + ([tokenizer.eos_token_id] if finish == "stop" else [])
    return Completion(tokens, [logprob] * len(tokens), finish, *version)


def as_trace(conversation: Conversation) -> Trace:
    trace = Trace(
        id="t",
        task=TaskRef("env", "train", 0),
        nodes=conversation.graph.nodes,
        branches=conversation.graph.branches(),
    )
    trace.validate()
    return trace


def test_builder_makes_one_branch_per_leaf_in_creation_order():
    graph = TraceBuilder()
    root = graph.add("user", [1, 2], [False, False], [], None)
    a = graph.add("assistant", [3], [True], [-0.1], root)
    b = graph.add("assistant", [4, 5], [True, True], [-0.2, -0.3], root)
    c = graph.add("user", [6], [False], [], a)
    assert [br.node_ids for br in graph.branches()] == [[root, b], [root, a, c]]
    assert graph.tokens(c) == [1, 2, 3, 6]
    assert graph.path(None) == []


@pytest.mark.parametrize(
    ("tokens", "mask", "logprobs", "parent", "error"),
    [
        ([1, 2], [True], [-1.0], None, ValueError),
        ([1, 2], [True, False], [], None, ValueError),
        ([1], [False], [], "missing", KeyError),
    ],
)
def test_builder_rejects_inconsistent_nodes(tokens, mask, logprobs, parent, error):
    with pytest.raises(error):
        TraceBuilder().add("user", tokens, mask, logprobs, parent)


def test_a_turn_is_the_prompt_the_model_saw_plus_what_it_sampled(tokenizer):
    conversation = Conversation(tokenizer)
    conversation.add_prompt("abc", system="rev")
    seen = conversation.prompt_ids()
    assert seen == (
        tokenizer.render_message("system", "rev")
        + tokenizer.render_message("user", "abc")
        + tokenizer.message_header("assistant")
    )
    conversation.add_completion(completion(tokenizer, "cba"))
    trace = as_trace(conversation)
    [branch] = trace.branches
    flat = trace.branch_tokens(0)
    assert flat.token_ids == seen + tokenizer.encode("cba") + [tokenizer.eos_token_id]
    assert flat.sampled_mask == [False] * len(seen) + [True] * 4
    for node in trace.nodes:
        assert len(node.logprobs) == sum(node.sampled_mask)
    assert [n.role for n in trace.nodes] == ["system", "user", "assistant"]
    assert trace.nodes[-1].content == "cba"
    assert conversation.last_text() == "cba" and conversation.last_text("user") == "abc"


def test_later_turns_extend_the_earlier_tokens_exactly(tokenizer):
    conversation = Conversation(tokenizer)
    conversation.add_prompt("dcba")
    prompts = []
    for answer, feedback in [("abdc", "2/4"), ("abcd", None)]:
        prompts.append(conversation.prompt_ids())
        conversation.add_completion(completion(tokenizer, answer))
        if feedback:
            conversation.add_observation("user", feedback)
    assert prompts[1][: len(prompts[0])] == prompts[0]
    trace = as_trace(conversation)
    assert len(trace.branches) == 1
    assert trace.branch_tokens(0).token_ids[: len(prompts[1])] == prompts[1]
    feedback = trace.nodes[2]
    assert feedback.is_observation and feedback.role == "user" and feedback.logprobs == []
    assert feedback.token_ids == tokenizer.render_message("user", "2/4")
    assert [m.role for m in conversation.messages()] == ["user", "assistant", "user", "assistant"]


def test_rewinding_forks_a_branch_and_keeps_the_old_one(tokenizer):
    conversation = Conversation(tokenizer)
    prompt = conversation.add_prompt("dcba")
    conversation.add_completion(completion(tokenizer, "zz"))
    first = conversation.tokens
    conversation.rewind(prompt)
    assert conversation.tokens == tokenizer.render_message("user", "dcba")
    conversation.add_observation("user", "zz 0/4")
    retry_prompt = conversation.prompt_ids()
    conversation.add_completion(completion(tokenizer, "abcd"))
    trace = as_trace(conversation)
    assert len(trace.branches) == 2
    assert trace.branch_tokens(0).token_ids == first
    assert trace.branch_tokens(1).token_ids[: len(retry_prompt)] == retry_prompt
    assert trace.branches[0].node_ids[0] == trace.branches[1].node_ids[0] == prompt
    with pytest.raises(ValueError, match="not on the current branch"):
        conversation.rewind(trace.branches[0].node_ids[1])


def test_policy_span_and_truncation_follow_the_completions(tokenizer):
    conversation = Conversation(tokenizer)
    conversation.add_prompt("x")
    assert conversation.policy_span == (0, 0) and not conversation.truncated
    conversation.add_completion(completion(tokenizer, "a", version=(4, 5)))
    conversation.add_observation("tool", "1")
    conversation.add_completion(completion(tokenizer, "bb", version=(6, 7), finish="length"))
    assert conversation.policy_span == (4, 7)
    assert conversation.truncated
