"""Fixtures for the env-server's pure core: the char tokenizer and a scripted in-memory model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlrun.common.tokenizer import CharTokenizer, load_tokenizer
from rlrun.common.wire.inference import Completion

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tokenizer() -> CharTokenizer:
    return load_tokenizer(REPO / "configs/tokenizer/char")


class ScriptedModel:
    """A Model whose answer is `policy(call_index, prompt_ids)`; it records every prompt."""

    def __init__(
        self,
        tokenizer: CharTokenizer,
        policy: Callable[[int, list[int]], str],
        logprob: float = -0.5,
        version: tuple[int, int] = (1, 1),
        max_tokens: int = 32,
    ):
        self.tokenizer = tokenizer
        self.policy = policy
        self.logprob = logprob
        self.version = version
        self.max_tokens = max_tokens
        self.calls: list[tuple[list[int], int]] = []

    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        text = self.policy(len(self.calls), list(prompt_ids))
        self.calls.append((list(prompt_ids), n))
        tokens = (self.tokenizer.encode(text) + [self.tokenizer.eos_token_id])[: self.max_tokens]
        finish = "stop" if tokens[-1] == self.tokenizer.eos_token_id else "length"
        return [Completion(tokens, [self.logprob] * len(tokens), finish, *self.version) for _ in range(n)]


@pytest.fixture
def scripted(tokenizer) -> Callable[..., ScriptedModel]:
    return lambda policy, **kw: ScriptedModel(tokenizer, policy, **kw)
