"""The models a harness talks to: one per plan target.

`InferenceModel` samples from an InferenceService; `RuleModel` is a rule-kind target, played
by the environment's own reference solution (the warm start's `oracle`); `RulePlayer` is a
rule-kind member of a multi-agent episode, played by the environment's rules; `OpenAIModel`
is an openai-kind target, an external OpenAI-compatible chat API that gets the member's
conversation as chat messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Protocol

from rlrun.common.tokenizer import ChatMessage, Tokenizer
from rlrun.common.wire.inference import Completion
from rlrun.common.wire.sampling import SamplingParams
from rlrun.env_server.sdk.inference_client import InferenceClient
from rlrun.env_server.sdk.openai_client import OpenAIChatClient


class Model(Protocol):
    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        """`n` continuations of `prompt_ids` (which end with the assistant header)."""
        ...


class InferenceModel:
    """Samples through `client` from the replicas at `addresses`. The token budget of each call
    is the plan's max_tokens, cut to what is left of the context; with no room left it returns
    empty `length` completions without calling. With a seed, call k uses seed + k, so that
    separate calls of one group do not repeat each other."""

    def __init__(
        self,
        client: InferenceClient,
        addresses: list[str],
        sampling: SamplingParams,
        max_model_len: int,
        request_id: str = "",
    ):
        self.client = client
        self.addresses = addresses
        self.sampling = sampling
        self.max_model_len = max_model_len
        self.request_id = request_id
        self.calls = 0

    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        room = self.max_model_len - len(prompt_ids)
        if room <= 0:
            return [Completion([], [], "length") for _ in range(n)]
        seed = None if self.sampling.seed is None else self.sampling.seed + self.calls
        sampling = dataclasses.replace(
            self.sampling, max_tokens=min(self.sampling.max_tokens, room), n=n, seed=seed
        )
        request_id = f"{self.request_id}:{self.calls}"
        self.calls += 1
        return await self.client.generate(self.addresses, prompt_ids, sampling, request_id)


def rule_completion(tokenizer: Tokenizer, answer: str, max_tokens: int, ended: bool = True) -> Completion:
    """`<answer><end>` as if sampled, logprobs 0.0 (so a supervised algorithm puts its loss on
    them), cut at max_tokens. `ended=False`: the answer was cut short (no end token)."""
    tokens = tokenizer.encode(answer) + ([tokenizer.eos_token_id] if ended else [])
    return Completion(
        tokens[:max_tokens],
        [0.0] * min(len(tokens), max_tokens),
        "stop" if ended and len(tokens) <= max_tokens else "length",
    )


class RuleModel:
    """Answers every prompt with the reference answer (see `rule_completion`)."""

    def __init__(self, tokenizer: Tokenizer, answer: str, max_tokens: int):
        self.completion = rule_completion(tokenizer, answer, max_tokens)

    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        return [self.completion] * n


class RulePlayer:
    """A rule-kind member of a multi-agent episode: its answer depends on the episode so far,
    so `reply()` is asked at the moment the member speaks (see `rule_completion`)."""

    def __init__(self, tokenizer: Tokenizer, reply: Callable[[], str], max_tokens: int):
        self.tokenizer = tokenizer
        self.reply = reply
        self.max_tokens = max_tokens

    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        return [rule_completion(self.tokenizer, self.reply(), self.max_tokens)] * n


class OpenAIModel:
    """An openai-kind target: the conversation so far (`messages()`, the member's own view) goes
    to the API as chat messages, and each reply is tokenized with the env's tokenizer like a
    rule answer (see `rule_completion`: logprob 0.0, no policy version). `n` continuations are
    n calls, at once, under the client's concurrency cap."""

    def __init__(
        self,
        client: OpenAIChatClient,
        tokenizer: Tokenizer,
        messages: Callable[[], list[ChatMessage]],
        sampling: SamplingParams,
    ):
        self.client = client
        self.tokenizer = tokenizer
        self.messages = messages
        self.sampling = sampling

    async def complete(self, prompt_ids: list[int], n: int = 1) -> list[Completion]:
        messages = self.messages()
        seed = self.sampling.seed
        choices = await asyncio.gather(
            *(
                self.client.chat(
                    messages, dataclasses.replace(self.sampling, seed=None if seed is None else seed + i)
                )
                for i in range(n)
            )
        )
        return [
            rule_completion(
                self.tokenizer, c.text, self.sampling.max_tokens, ended=c.finish_reason != "length"
            )
            for c in choices
        ]
