"""Bounded work on a real inference service (`rlrun serve inference` as a subprocess, with its
engine process), watched from outside (tests/support/proc_watch.py): its process tree's CPU
time and memory from /proc, and a health probe loop with a kubelet's 1 s probe timeout.

- A Generate over `limits.max_samples` is refused at once naming the field and the limit.
- A long Generate (every sample the queue holds, each to the end of the context) with a short
  deadline ends DEADLINE_EXCEEDED, the engine stops generating for it within a bounded grace,
  and the memory it took comes back.
- The same work asked of the OpenAI HTTP API by the `openai` client, which goes away mid-call
  (a stream closed after its first chunk, or a whole reply given up at the client's timeout):
  the engine stops generating for it as soon, and the memory comes back.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import openai
import pytest
from kubecluster.processes import free_port
from proc_watch import HealthProbe, TreeSampler, sample_tree

from rlrun.bench.services import start_service, stop_service
from rlrun.common.config import load_config
from rlrun.v1 import inference_pb2, inference_pb2_grpc, sampling_pb2

from .conftest import REPO

CONFIG = REPO / "configs/reverse_text.toml"
MB = 2**20
RSS_MARGIN_MB = 64
"""How far above its level before the call the service's memory may stay after it."""
GRACE_S = 2.0
"""How long after the caller's deadline the engine may still work on the call: the server
notices the cancellation, the engine drops the request's rows between two steps."""
QUIET_WINDOW_S = 1.0
PROBE_FAILURES = 3
"""Consecutive failed probes after which a kubelet restarts the container."""


@pytest.fixture
async def inference(tmp_path):
    process, address = await start_service("inference", CONFIG, tmp_path)
    async with grpc.aio.insecure_channel(address) as channel:
        yield process, address, inference_pb2_grpc.InferenceServiceStub(channel)
    await stop_service(process)


@pytest.fixture
async def served(tmp_path):
    """An inference service with its OpenAI HTTP API, and the `openai` client for it."""
    port = free_port()
    process, address = await start_service(
        "inference", CONFIG, tmp_path, overrides=[f"inference.http_port={port}"]
    )
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
    ) as client:
        yield process, address, client
    await stop_service(process)


def everything(limits_n: int) -> inference_pb2.GenerateRequest:
    """`limits_n` samples, each of as many tokens as the context leaves (no stop tokens)."""
    prompt = [4, 5, 6, 7]
    max_len = load_config(CONFIG).model.max_model_len
    return inference_pb2.GenerateRequest(
        prompt_token_ids=prompt,
        sampling=sampling_pb2.SamplingParams(temperature=1.0, max_tokens=max_len - len(prompt), n=limits_n),
    )


async def settled_rss(pid: int, seconds: float = 2.0) -> int:
    readings = []
    for _ in range(int(seconds / 0.2)):
        readings.append(sample_tree(pid).rss)
        await asyncio.sleep(0.2)
    return min(readings)


async def test_more_samples_than_the_limit_are_refused_naming_the_field(inference):
    _, _, stub = inference
    limit = load_config(CONFIG).request_limits().max_samples
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(everything(limit + 1), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        f"sampling.n: sampling.n = {limit + 1} samples exceed the limit limits.max_samples = {limit}"
    )


async def test_a_long_generate_past_its_deadline_stops_and_gives_its_memory_back(inference):
    process, address, stub = inference
    limit = load_config(CONFIG).request_limits().max_samples
    await stub.Generate(everything(8), timeout=60)  # warm: the first batch pays for its set-up
    before = await settled_rss(process.pid)
    # The whole call, to show how long it runs without a deadline (and that it is long).
    started = time.monotonic()
    await stub.Generate(everything(limit), timeout=300)
    whole_s = time.monotonic() - started
    deadline_s = whole_s / 4
    with HealthProbe(address) as probe, TreeSampler(process.pid) as sampler:
        await asyncio.sleep(0.5)
        pids = frozenset(sampler.samples[-1].cpu_s)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Generate(everything(limit), timeout=deadline_s)
        ended = time.monotonic()
        stopped = await asyncio.to_thread(
            sampler.wait_quiet, ended, GRACE_S + 60, window_s=QUIET_WINDOW_S, pids=pids
        )
        peak = sampler.peak_rss(started)
    after = await settled_rss(process.pid)
    print(
        f"the whole call: {whole_s:.2f} s; with a {deadline_s:.2f} s deadline: "
        f"{caught.value.code().name} after {ended - started:.2f} s, work stopped {stopped - ended:.2f} s "
        f"after; RSS before {before / MB:.1f} MB, peak {peak / MB:.1f} MB, after {after / MB:.1f} MB; "
        f"health: {probe.probes} probes, slowest {probe.slowest_s:.3f} s, failures {probe.failures}"
    )
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stopped - ended <= GRACE_S + QUIET_WINDOW_S
    assert (after - before) / MB < RSS_MARGIN_MB
    assert probe.failures_in_a_row < PROBE_FAILURES, probe.failures
    # It still serves.
    reply = await stub.Generate(everything(2), timeout=60)
    assert len(reply.completions) == 2


def chat_of_everything(samples: int) -> dict:
    """A chat of `samples` choices, each as long as the context leaves (min_tokens: no early stop)."""
    tokens = load_config(CONFIG).model.max_model_len - 8  # the chat's prompt is 6 tokens
    return {
        "model": "reverse_text",
        "messages": [{"role": "user", "content": "abc"}],
        "max_tokens": tokens,
        "n": samples,
        "temperature": 1.0,
        "extra_body": {"min_tokens": tokens},
    }


@pytest.mark.parametrize("how", ["a stream closed after its first chunk", "a reply given up at its timeout"])
async def test_a_client_that_goes_away_mid_call_stops_its_generation(served, how):
    process, address, client = served
    limit = load_config(CONFIG).request_limits().max_samples
    await client.chat.completions.create(**chat_of_everything(8))  # warm
    before = await settled_rss(process.pid)
    started = time.monotonic()
    await client.chat.completions.create(**chat_of_everything(limit), timeout=300)
    whole_s = time.monotonic() - started
    with HealthProbe(address) as probe, TreeSampler(process.pid) as sampler:
        await asyncio.sleep(0.5)
        pids = frozenset(sampler.samples[-1].cpu_s)
        started = time.monotonic()
        if how.startswith("a stream"):
            stream = await client.chat.completions.create(**chat_of_everything(limit), stream=True)
            async for _ in stream:
                break
            await stream.close()
        else:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(**chat_of_everything(limit), timeout=whole_s / 4)
        gone = time.monotonic()
        stopped = await asyncio.to_thread(
            sampler.wait_quiet, gone, GRACE_S + 60, window_s=QUIET_WINDOW_S, pids=pids
        )
    after = await settled_rss(process.pid)
    print(
        f"the whole call: {whole_s:.2f} s; {how} after {gone - started:.2f} s; work stopped "
        f"{stopped - gone:.2f} s after; RSS before {before / MB:.1f} MB, after {after / MB:.1f} MB; "
        f"health: {probe.probes} probes, failures {probe.failures}"
    )
    assert gone - started < whole_s / 2  # it went away while the work had far to go
    assert stopped - gone <= GRACE_S + QUIET_WINDOW_S
    assert (after - before) / MB < RSS_MARGIN_MB
    assert probe.failures == []  # a stream's chunks are sent a turn of the loop each
    reply = await client.chat.completions.create(**chat_of_everything(2))
    assert len(reply.choices) == 2
