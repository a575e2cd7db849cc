"""Builders of hand-made traces and groups for the orchestrator's unit tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlrun.common.wire.trace import Branch, MessageNode, TaskRef, Trace, TraceError
from rlrun.orchestrator.collect.group import RolloutGroup


def node(nid, role, tokens, sampled=None, logprobs=None, parent=None, observation=False, parse_error=False):
    sampled = [False] * len(tokens) if sampled is None else sampled
    if sampled is True:
        sampled = [True] * len(tokens)
    if logprobs is None:
        logprobs = [-0.5] * sum(sampled)
    return MessageNode(
        id=nid,
        role=role,
        token_ids=list(tokens),
        sampled_mask=list(sampled),
        logprobs=list(logprobs),
        parent=parent,
        is_observation=observation,
        parse_error=parse_error,
    )


def trace(
    tid,
    reward=0.0,
    *,
    prompt=(3, 10, 11),
    completion=(20, 21, 1),
    logprobs=None,
    member="policy",
    env="rev",
    idx=0,
    span=(0, 0),
    errors=(),
    data="",
):
    """A single-turn trace: a user prompt node and a sampled assistant node, one branch."""
    nodes = [
        node("u", "user", prompt),
        node("a", "assistant", completion, sampled=True, logprobs=logprobs, parent="u"),
    ]
    return Trace(
        id=tid,
        task=TaskRef(env=env, split="train", idx=idx, data=data),
        nodes=nodes,
        branches=[Branch(["u", "a"])],
        member_id=member,
        reward=reward,
        policy_span=span,
        errors=[TraceError(*e) for e in errors],
    )


def multi_turn(tid, reward=0.0):
    """user(2) -> assistant(2 sampled) -> tool observation(3) -> assistant(2 sampled), one branch of 9 tokens."""
    nodes = [
        node("u", "user", [3, 10]),
        node("a1", "assistant", [20, 21], sampled=True, logprobs=[-0.1, -0.2], parent="u"),
        node("t", "tool", [5, 30, 31], parent="a1", observation=True),
        node("a2", "assistant", [22, 1], sampled=True, logprobs=[-0.3, -0.4], parent="t"),
    ]
    return Trace(
        id=tid,
        task=TaskRef(env="rev", split="train", idx=0),
        nodes=nodes,
        branches=[Branch(["u", "a1", "t", "a2"])],
        reward=reward,
    )


def branching(tid, reward=0.0):
    """Two branches sharing `u` and `a1`: [u, a1, f1, a2] and [u, a1, f2, a3]."""
    nodes = [
        node("u", "user", [3, 10]),
        node("a1", "assistant", [20, 21], sampled=True, parent="u"),
        node("f1", "user", [3, 40], parent="a1", observation=True),
        node("a2", "assistant", [22, 1], sampled=True, parent="f1"),
        node("f2", "user", [3, 41], parent="a1", observation=True),
        node("a3", "assistant", [23, 24, 1], sampled=True, parent="f2"),
    ]
    return Trace(
        id=tid,
        task=TaskRef(env="rev", split="train", idx=0),
        nodes=nodes,
        branches=[Branch(["u", "a1", "f1", "a2"]), Branch(["u", "a1", "f2", "a3"])],
        reward=reward,
    )


def group(traces, env="rev", trained=frozenset({"policy"}), temperatures=None, version=0):
    members = {t.member_id for t in traces}
    return RolloutGroup(
        group_id="g",
        env=env,
        task=TaskRef(env=env, split="train", idx=0),
        traces=list(traces),
        dispatch_version=version,
        trained_members=frozenset(trained),
        temperatures=temperatures or dict.fromkeys(members, 1.0),
    )


@pytest.fixture
def build():
    return SimpleNamespace(node=node, trace=trace, multi_turn=multi_turn, branching=branching, group=group)
