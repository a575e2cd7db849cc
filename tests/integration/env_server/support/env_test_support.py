"""Test-only helpers importable by name (conftest puts this folder on sys.path, and spawned
pool workers inherit the path): a scripted InferenceService and a few test environments."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from rlrun.common.tokenizer import CharTokenizer
from rlrun.env_server.sdk.environment import Environment
from rlrun.env_server.sdk.episode import Episode
from rlrun.env_server.sdk.harnesses import SingleTurnHarness
from rlrun.env_server.sdk.task import Example, Score, Task
from rlrun.env_server.sdk.taskset import GeneratedTaskset
from rlrun.v1 import inference_pb2, inference_pb2_grpc

TOKENIZER_PATH = "configs/tokenizer/char"
LOGPROB = -0.25
POLICY_VERSION = 3


def last_message(tokenizer: CharTokenizer, prompt: list[int]) -> str:
    """Text of the last complete message before the assistant header."""
    end = tokenizer.eos_token_id
    body = prompt[:-1]  # drop the assistant header
    start = max((i for i, t in enumerate(body[:-1]) if t == end), default=-1) + 2
    return tokenizer.decode(body[start:-1])


def reverse_policy(tokenizer: CharTokenizer, prompt: list[int]) -> str:
    return last_message(tokenizer, prompt)[::-1]


@dataclass
class ScriptedInference(inference_pb2_grpc.InferenceServiceServicer):
    """Answers Generate with `policy(tokenizer, prompt) + <|end|>`, logprob LOGPROB per token,
    at POLICY_VERSION. `hold` blocks calls until set; `fail_with` aborts them with that code."""

    tokenizer: CharTokenizer
    policy: Callable[[CharTokenizer, list[int]], str] = reverse_policy
    requests: list[inference_pb2.GenerateRequest] = field(default_factory=list)
    hold: threading.Event | None = None
    fail_with: grpc.StatusCode | None = None
    arrived: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
        self.hold = None
        self.fail_with = None
        self.policy = reverse_policy
        self.arrived.clear()

    def Generate(self, request, context):
        with self.lock:
            self.requests.append(request)
        self.arrived.set()
        if self.hold is not None:
            while not self.hold.wait(0.05):
                if not context.is_active():
                    return inference_pb2.GenerateResponse()
        if self.fail_with is not None:
            context.abort(self.fail_with, "scripted failure")
        prompt = list(request.prompt_token_ids)
        tokens = self.tokenizer.encode(self.policy(self.tokenizer, prompt)) + [self.tokenizer.eos_token_id]
        limit = request.sampling.max_tokens
        finish = (
            inference_pb2.FINISH_REASON_STOP if len(tokens) <= limit else inference_pb2.FINISH_REASON_LENGTH
        )
        tokens = tokens[:limit]
        completion = inference_pb2.Completion(
            token_ids=tokens,
            logprobs=[LOGPROB] * len(tokens),
            finish_reason=finish,
            policy_version_start=POLICY_VERSION,
            policy_version_end=POLICY_VERSION,
        )
        return inference_pb2.GenerateResponse(
            completions=[completion] * (request.sampling.n or 1), prompt_tokens=len(prompt)
        )


@dataclass
class RunningInference:
    server: grpc.Server
    servicer: ScriptedInference
    address: str

    def stop(self) -> None:
        if self.servicer.hold is not None:
            self.servicer.hold.set()
        self.server.stop(0)


def start_inference(tokenizer: CharTokenizer) -> RunningInference:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    servicer = ScriptedInference(tokenizer)
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return RunningInference(server, servicer, f"127.0.0.1:{port}")


def _draw(rng) -> Example:
    text = "".join(rng.choices("abcdefghij", k=rng.randint(3, 5)))
    return Example(key=text, prompt=text, data={"answer": text[::-1]})


class _TestEnv(Environment):
    def __init__(self, **_):
        self.taskset = GeneratedTaskset(_draw, eval_size=8)
        self.harness = SingleTurnHarness()

    def score(self, task: Task, episode: Episode) -> Score:
        return Score.of("match", float(episode.answer == task.data["answer"]))


class BrokenHarnessEnv(_TestEnv):
    """Its harness has a programming error."""

    def __init__(self, **args):
        super().__init__(**args)

        class Broken(SingleTurnHarness):
            async def run_group(self, episodes):
                raise TypeError("unsupported operand type(s)")

        self.harness = Broken()


class NoReferenceEnv(_TestEnv):
    """Scores like the others but has no reference answer (cannot play rule targets)."""


class RankedEnv(_TestEnv):
    """Group scoring: each rollout's reward is its rank among the group's answer lengths."""

    def score_group(self, task: Task, episodes: list[Episode]) -> list[Score]:
        order = sorted(range(len(episodes)), key=lambda i: len(episodes[i].answer))
        ranks = {i: r for r, i in enumerate(order)}
        return [Score.of("rank", ranks[i] / max(1, len(episodes) - 1)) for i in range(len(episodes))]

    def reference_answer(self, task: Task) -> str:
        return task.data["answer"]


class SlowEnv(_TestEnv):
    """Its harness sleeps `delay_s` before generating."""

    def __init__(self, delay_s: float = 0.5, **args):
        super().__init__(**args)
        outer = self

        class Slow(SingleTurnHarness):
            async def run_group(self, episodes):
                await asyncio.sleep(outer.delay_s)
                await super().run_group(episodes)

        self.delay_s = delay_s
        self.harness = Slow()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
