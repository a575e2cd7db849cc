"""InferenceService over real gRPC: generation, bad input, weight updates, cancellation,
pause, status, health gating."""

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlrun.common.weights.grpc_stream import iter_update_messages
from rlrun.v1 import inference_pb2, sampling_pb2, weights_pb2

from .conftest import REPO, other_weights

GREEDY = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=12)


def generate(prompt, sampling=GREEDY) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(prompt_token_ids=prompt, sampling=sampling)


def update(tensors, version, chunk_bytes=16 * 1024, rollback=False):
    return list(iter_update_messages(tensors, version, chunk_bytes, rollback))


async def greedy_tokens(stub) -> list[int]:
    response = await stub.Generate(generate([4, 20, 21, 22, 1, 5]))
    return list(response.completions[0].token_ids)


async def test_generate_returns_n_completions_with_logprobs_and_versions(service):
    sampling = sampling_pb2.SamplingParams(temperature=1.0, max_tokens=10, n=3, stop_token_ids=[1])
    response = await service.stub.Generate(generate([4, 20, 21, 1, 5], sampling))
    assert response.prompt_tokens == 5
    assert len(response.completions) == 3
    for completion in response.completions:
        assert 1 <= len(completion.token_ids) <= 10
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(lp <= 0 for lp in completion.logprobs)
        if completion.finish_reason == inference_pb2.FINISH_REASON_STOP:
            assert completion.token_ids[-1] == 1
        else:
            assert (
                completion.finish_reason == inference_pb2.FINISH_REASON_LENGTH
                and len(completion.token_ids) == 10
            )
        assert (completion.policy_version_start, completion.policy_version_end) == (0, 0)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (generate([]), "prompt_token_ids"),
        (generate([4, 128]), "prompt_token_ids[1]"),
        (
            generate([4, 5], sampling_pb2.SamplingParams(temperature=-1.0, max_tokens=4)),
            "sampling.temperature",
        ),
        (
            generate([4, 5], sampling_pb2.SamplingParams(temperature=1.0, max_tokens=31)),
            "sampling.max_tokens",
        ),
        (generate([4, 5], sampling_pb2.SamplingParams(temperature=1.0, max_tokens=0)), "sampling.max_tokens"),
        # More samples than inference.max_waiting (4096): no retry could ever be queued.
        (generate([4, 5], sampling_pb2.SamplingParams(temperature=1.0, max_tokens=2, n=5000)), "sampling.n"),
    ],
)
async def test_bad_generate_input_is_invalid_argument_naming_the_field(service, request_, field):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.Generate(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:")


async def test_score_matches_the_generated_logprobs(service):
    prompt = [4, 20, 21, 1, 5]
    response = await service.stub.Generate(
        generate(prompt, sampling_pb2.SamplingParams(temperature=0.7, max_tokens=8))
    )
    completion = response.completions[0]
    scored = await service.stub.Score(
        inference_pb2.ScoreRequest(
            token_ids=prompt + list(completion.token_ids), start=len(prompt), temperature=0.7
        )
    )
    assert scored.logprobs == pytest.approx(list(completion.logprobs), abs=1e-4)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.Score(inference_pb2.ScoreRequest(token_ids=prompt, start=0))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and caught.value.details().startswith(
        "start:"
    )


async def test_a_weight_update_changes_outputs_and_the_version(service, caplog):
    caplog.set_level(logging.INFO, logger="rlrun.inference.servicer")
    before = await greedy_tokens(service.stub)
    tensors = other_weights(service.service.config, seed=9)
    reply = await service.stub.UpdateWeights(update(tensors, 3))
    assert reply.version == 3 and reply.bytes_received == sum(t.numel() * 4 for t in tensors.values())
    updated = await greedy_tokens(service.stub)
    assert updated != before
    status = await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
    assert status.policy_version == 3
    response = await service.stub.Generate(generate([4, 5]))
    assert response.completions[0].policy_version_start == 3
    # The next update of the same tensor list lands in the same staging area, through the
    # views the first one built; the old weights come back with it.
    config = service.service.config
    await service.stub.UpdateWeights(update(other_weights(config, seed=config.model.seed), 4))
    assert await greedy_tokens(service.stub) == before
    logged = [r.getMessage() for r in caplog.records if "committed" in r.getMessage()]
    assert [line.split(" received")[0] for line in logged] == [
        f"weights of version {version} ({reply.bytes_received} bytes)" for version in (3, 4)
    ]


def wrong_shape(messages):
    messages[0].header.tensors[0].shape[0] += 1
    return messages, grpc.StatusCode.INVALID_ARGUMENT, "header.tensors[0].shape"


def bad_checksum(messages):
    messages[0].header.checksum ^= 1
    return messages, grpc.StatusCode.INVALID_ARGUMENT, "header.checksum"


def short_stream(messages):
    return messages[:-1], grpc.StatusCode.ABORTED, "chunks"


def chunk_first(messages):
    return messages[1:], grpc.StatusCode.INVALID_ARGUMENT, "header"


def empty_stream(messages):
    return [], grpc.StatusCode.ABORTED, "chunks"


def out_of_order(messages):
    return (
        [messages[0], messages[2], messages[1], *messages[3:]],
        grpc.StatusCode.INVALID_ARGUMENT,
        "chunk.index",
    )


def nccl_on_torch(messages):
    header = messages[0].header
    header.transport = weights_pb2.WEIGHT_TRANSPORT_NCCL
    header.nccl.CopyFrom(weights_pb2.NcclRendezvous(host="127.0.0.1", port=1, world_size=2, rank=1))
    # No backend named: vLLM's communicator, which the torch engine does not join.
    return messages[:1], grpc.StatusCode.INVALID_ARGUMENT, "header.nccl.backend"


@pytest.mark.parametrize(
    "damage",
    [wrong_shape, bad_checksum, short_stream, chunk_first, empty_stream, out_of_order, nccl_on_torch],
)
async def test_a_failed_weight_update_leaves_outputs_and_version_unchanged(service, damage):
    before = await greedy_tokens(service.stub)
    messages, code, field = damage(update(other_weights(service.service.config, seed=9), 1))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.UpdateWeights(messages)
    assert caught.value.code() == code
    assert caught.value.details().startswith(field)
    assert await greedy_tokens(service.stub) == before
    status = await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
    assert status.policy_version == 0


async def test_an_older_version_is_refused(service):
    tensors = other_weights(service.service.config, seed=9)
    await service.stub.UpdateWeights(update(tensors, 5))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await service.stub.UpdateWeights(update(tensors, 4))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("header.version")


async def test_a_rollback_takes_an_older_version_and_its_weights(service):
    initial = await greedy_tokens(service.stub)
    await service.stub.UpdateWeights(update(other_weights(service.service.config, seed=9), 5))
    assert await greedy_tokens(service.stub) != initial
    back = other_weights(service.service.config, seed=service.service.config.model.seed)
    await service.stub.UpdateWeights(update(back, 2, rollback=True))
    status = await service.stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
    assert status.policy_version == 2
    assert await greedy_tokens(service.stub) == initial


async def wait_for_status(stub, predicate):
    while True:
        status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
        if predicate(status):
            return status
        await asyncio.sleep(0.005)


async def test_a_cancelled_client_frees_its_batch_slot(start_service):
    # A rotary-position model, so the hog's 240 tokens fit (the demo's GPT-2 has 64 positions).
    running = await start_service(
        "inference.max_batch_size=1",
        "model.max_model_len=250",
        f'model.config="{REPO / "configs/models/tiny-d64.json"}"',
        f'model.tokenizer="{REPO / "configs/tokenizer/char"}"',
        http=False,
    )
    stub = running.stub
    await stub.Pause(inference_pb2.PauseRequest())
    hog = stub.Generate(generate([4, 5], sampling_pb2.SamplingParams(temperature=1.0, max_tokens=240)))
    queued = stub.Generate(generate([4, 6], sampling_pb2.SamplingParams(temperature=1.0, max_tokens=3)))
    await wait_for_status(stub, lambda s: s.waiting_requests == 2)
    await stub.Resume(inference_pb2.ResumeRequest())
    await wait_for_status(stub, lambda s: s.running_requests == 1)
    await stub.Pause(inference_pb2.PauseRequest())
    status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
    assert (status.running_requests, status.waiting_requests, status.paused) == (1, 1, True)
    hog.cancel()
    await wait_for_status(stub, lambda s: s.running_requests == 0)
    await stub.Resume(inference_pb2.ResumeRequest())
    response = await queued
    assert len(response.completions[0].token_ids) == 3
    with pytest.raises(asyncio.CancelledError):
        await hog


async def test_health_is_serving_once_loaded(service):
    health = health_pb2_grpc.HealthStub(service.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="rlrun.v1.InferenceService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_require_version_holds_health_until_those_weights_arrive(start_service):
    import httpx

    running = await start_service(require_version=2)
    health = health_pb2_grpc.HealthStub(running.channel)

    async def check():
        grpc_status = (await health.Check(health_pb2.HealthCheckRequest())).status
        async with httpx.AsyncClient() as client:
            http_status = (await client.get(f"{running.http_url}/health")).status_code
        return grpc_status, http_status

    not_serving = (health_pb2.HealthCheckResponse.NOT_SERVING, 503)
    assert await check() == not_serving
    tensors = other_weights(running.service.config, seed=9)
    await running.stub.UpdateWeights(update(tensors, 1))
    assert await check() == not_serving
    await running.stub.UpdateWeights(update(tensors, 2))
    assert await check() == (health_pb2.HealthCheckResponse.SERVING, 200)
