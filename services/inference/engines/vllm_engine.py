"""The vLLM engine (the `vllm` extra, GPUs): vLLM's AsyncLLM, token-in/token-out.

vLLM is imported lazily, inside the methods that need it, so this module (and its pure
translation functions, unit-tested on CPU) imports without it.

Semantics against the torch engine:
- Generation stops only on the request's `stop_token_ids` (`ignore_eos`), and the stop token
  is returned, as with the torch engine.
- Logprobs come from vLLM's `processed_logprobs` mode: after the logit bias, the penalties,
  temperature (T = 1 for greedy) and min-p/top-k/top-p truncation, renormalised over what it
  kept: the distribution sampled from, as the torch engine's sampler reports them.
- `min_tokens` holds off the request's `stop_token_ids` and, in vLLM, the checkpoint's
  `eos_token_id` as well, whatever `ignore_eos` says; the OpenAI layer always lists the end
  tokens in `stop_token_ids`, so both engines hold off the same tokens there.
- `policy_version_start` is the version when the request was submitted (vLLM reports no
  per-token timing here): a conservative bound for staleness checks.
- Score runs at temperature 1 only (vLLM's prompt logprobs are raw).
- Structured outputs (the `json_schema` knob, `rlrun.inference.logits.grammar`) use vLLM's
  own, with its llguidance backend and the torch engine's compact JSON (the schema carries
  llguidance's options). vLLM compiles grammars over its tokenizer, so it loads the
  checkpoint's (`loads_tokenizer`); with a char tokenizer file it runs without one and
  refuses them. Its masks are the torch engine's, but a sample ends with the end token the
  completed value leaves as the only choice, where the torch engine ends it with the value's
  last token.
- Every other logits processor's knob is mapped by the processor itself
  (`LogitsProcessor.vllm_kwargs`); one vLLM has no equivalent of is a RequestError.
- Weight updates run inside vLLM's workers through `collective_rpc`, which the engine core
  executes between two scheduler steps; the prefix cache is reset afterwards so no new request
  reuses K/V computed under the old weights. See `vllm_worker` for the NCCL path.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlrun.common.config import RunConfig
from rlrun.common.errors import RequestError
from rlrun.common.model import ArchConfig, arch_dict, build_model, create_model, save_checkpoint_dir
from rlrun.common.model.load import DTYPES
from rlrun.common.weights.protocol import broadcast_tensors, dtype_name, node_id
from rlrun.common.wire.inference import Completion, FinishReason, InferenceStatus, ScoreResult, TopLogprobs
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.weights import WeightSyncInfo, WeightUpdateHeader
from rlrun.inference import metrics
from rlrun.inference.engines.base import Engine, StreamDelta
from rlrun.inference.logits import vllm_kwargs
from rlrun.inference.params import GenerationParams
from rlrun.inference.throughput import ThroughputMeter

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rlrun.inference.engines.vllm_worker.RlrunWorkerExtension"

VLLM_VERSIONS = ">=0.16,<0.34"
"""The vLLM releases this adapter runs on, as the `vllm` extra requires them: 0.16 brought
`pause_generation(mode="keep")`, which holds requests across a weight update; 0.32 is the
release `make test-vllm-cpu` runs, and 0.33's sources have every API used here. vLLM moves
its APIs between releases, so a newer one is admitted once the checks run on it."""

_FINISH_REASONS: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    None: "abort",
}


# -- pure translation (no vllm import) -------------------------------------------------------


def check_vllm_version(installed: str) -> None:
    """Fails, naming both, unless `installed` is one of VLLM_VERSIONS (development builds of
    them included: GPU clusters often run vLLM's nightlies)."""
    from packaging.specifiers import SpecifierSet

    if not SpecifierSet(VLLM_VERSIONS).contains(installed, prereleases=True):
        raise RuntimeError(
            f"inference.engine = 'vllm' runs on vLLM {VLLM_VERSIONS}, but vLLM {installed} is "
            "installed: pip install 'rlrun[vllm]' installs a supported one"
        )


def loads_tokenizer(config: RunConfig) -> bool:
    """Whether vLLM loads the checkpoint's tokenizer: when the service's own tokenizer is that
    one (no char tokenizer file). The service never sends it text; vLLM needs it only to
    compile structured outputs' grammars."""
    return config.model.tokenizer is None and config.model.path is not None


def engine_args(config: RunConfig, model_dir: Path) -> dict[str, Any]:
    """Keyword arguments of vllm.AsyncEngineArgs for this run (`structured_outputs_config` as
    the keyword arguments of its StructuredOutputsConfig)."""
    vllm_cfg = config.inference.vllm
    return {
        "model": str(model_dir),
        "skip_tokenizer_init": not loads_tokenizer(config),
        # llguidance, as the torch engine: it reads the compact-JSON options in the schema.
        "structured_outputs_config": {"backend": "guidance"},
        "max_model_len": config.model.max_model_len,
        "max_num_seqs": config.inference.max_batch_size,
        "dtype": config.model.dtype,
        "seed": config.model.seed,
        "gpu_memory_utilization": vllm_cfg.gpu_memory_utilization,
        "tensor_parallel_size": vllm_cfg.tensor_parallel_size,
        "enforce_eager": vllm_cfg.enforce_eager,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
    }


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of vllm.SamplingParams (the output kind is added by the caller;
    `structured_outputs`, when there, as the keyword arguments of its StructuredOutputsParams).
    Each logits processor says how vLLM spells its knob (`LogitsProcessor.vllm_kwargs`)."""
    params = GenerationParams.of(params)
    return {
        **vllm_kwargs(params.knobs),
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "max_tokens": params.max_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True,
        "seed": params.seed,
        # The sampled token's logprob, and the most likely tokens' where the request asks.
        "logprobs": params.top_logprobs,
        "detokenize": False,
    }


def sampled_logprobs(token_ids: Sequence[int], logprobs: Sequence[dict] | None) -> list[float]:
    """vLLM gives one {token_id: Logprob} dict per sampled token; keep the sampled token's."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs although the request asked for them")
    return [float(entry[token].logprob) for token, entry in zip(token_ids, logprobs, strict=True)]


def top_logprobs_of(logprobs: Sequence[dict], count: int) -> list[TopLogprobs] | None:
    """The `count` most likely tokens of each position: vLLM's dicts hold them (by rank, 1 =
    most likely) beside the sampled token. None when the request asked for none."""
    if not count:
        return None
    return [
        [
            (token, float(entry.logprob))
            for token, entry in sorted(position.items(), key=lambda item: item[1].rank)
            if entry.rank <= count
        ]
        for position in logprobs
    ]


def completion_from_output(
    output: Any, version_start: int, version_end: int, top_count: int = 0
) -> Completion:
    """A vllm CompletionOutput (token_ids, logprobs, finish_reason) as a Completion."""
    token_ids = list(output.token_ids)
    return Completion(
        token_ids=token_ids,
        logprobs=sampled_logprobs(token_ids, output.logprobs),
        finish_reason=_FINISH_REASONS.get(output.finish_reason, "abort"),
        policy_version_start=version_start,
        policy_version_end=version_end,
        top_logprobs=top_logprobs_of(output.logprobs, top_count),
    )


def delta_from_output(output: Any, top_count: int = 0) -> StreamDelta:
    """A vllm CompletionOutput of a DELTA-kind request (only the new tokens) as a StreamDelta."""
    token_ids = list(output.token_ids)
    reason = output.finish_reason
    return StreamDelta(
        index=output.index,
        token_ids=token_ids,
        logprobs=sampled_logprobs(token_ids, output.logprobs),
        finish_reason=None if reason is None else _FINISH_REASONS.get(reason, "abort"),
        top_logprobs=top_logprobs_of(output.logprobs, top_count),
    )


def prompt_scores(
    token_ids: Sequence[int], start: int, prompt_logprobs: Sequence[dict | None]
) -> list[float]:
    """Logprobs of token_ids[start:] from vLLM's prompt_logprobs (entry 0 is None)."""
    return [float(prompt_logprobs[i][token_ids[i]].logprob) for i in range(start, len(token_ids))]


def nccl_tensor_specs(
    header: WeightUpdateHeader, expected: dict[str, torch.Tensor]
) -> list[tuple[str, str, list[int]]]:
    """(name, torch dtype name, shape) per announced tensor, in stream order, after checking
    that the header announces exactly the model's tensors."""
    announced = {spec.name: (spec.dtype, tuple(spec.shape)) for spec in header.tensors}
    wanted = {name: (dtype_name(t.dtype), tuple(t.shape)) for name, t in expected.items()}
    if len(announced) != len(header.tensors) or announced != wanted:
        differing = sorted(set(announced.items()) ^ set(wanted.items()))[:5]
        raise RequestError(
            "header.tensors", f"header.tensors does not match the model; differing entries: {differing}"
        )
    return [(spec.name, spec.dtype, list(spec.shape)) for spec in header.tensors]


def tensor_payload(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, str, list[int], bytes]]:
    """(name, torch dtype name, shape, raw bytes) per tensor: what `collective_rpc` can carry
    to vLLM's worker processes (they pickle their arguments, and tensors' memoryviews do not
    pickle). `vllm_worker.tensors_from_payload` is the inverse."""
    return [
        (
            name,
            str(t.dtype).removeprefix("torch."),
            list(t.shape),
            t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
        )
        for name, t in tensors.items()
    ]


def meta_tensors(config: RunConfig) -> dict[str, torch.Tensor]:
    """The model's broadcast tensors on the meta device: names, dtypes, shapes, no memory."""
    with torch.device("meta"):
        model = create_model(ArchConfig.from_dict(arch_dict(config.model)))
    return broadcast_tensors(model.to(DTYPES[config.model.dtype]))


# -- the engine ------------------------------------------------------------------------------


def token_prompt(token_ids: Sequence[int]) -> dict:
    """Token ids as vLLM takes them: an engine input where vLLM has the renderer pipeline
    (raw prompts are deprecated there), a TokensPrompt before it."""
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=list(token_ids))
    return tokens_input(list(token_ids))


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config: RunConfig):
        self.config = config
        self.model_name = config.name
        self.vocab_size = ArchConfig.from_dict(arch_dict(config.model)).vocab_size
        self.max_model_len = config.model.max_model_len
        self._specs = meta_tensors(config)
        self._version = 0
        self._in_flight = 0
        self._paused = False
        self._nccl_group: tuple | None = None
        self._meter = ThroughputMeter()
        self._llm = None
        self.structured_outputs = loads_tokenizer(config)

    def _model_dir(self) -> Path:
        """A checkpoint directory vLLM can load: model.path, or the seeded random init saved once."""
        if self.config.model.path is not None:
            return Path(self.config.model.path)
        target = self.config.run_dir / "vllm-init-model"
        save_checkpoint_dir(build_model(self.config.model), arch_dict(self.config.model), target)
        return target

    async def start(self) -> None:
        try:
            import vllm
        except ImportError as error:
            raise RuntimeError(
                "inference.engine = 'vllm' needs vLLM, the `vllm` extra: pip install 'rlrun[vllm]'"
            ) from error
        check_vllm_version(vllm.__version__)
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        model_dir = await asyncio.to_thread(self._model_dir)
        args = engine_args(self.config, model_dir)
        args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        metrics.POLICY_VERSION.set(self._version)

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    @property
    def policy_version(self) -> int:
        return self._version

    def _request(self, prompt: Sequence[int], params: SamplingParams, request_id: str, delta: bool):
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kind = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
        unique_id = f"{request_id or 'req'}-{uuid.uuid4().hex}"  # vLLM needs ids unique among live requests
        kwargs = sampling_kwargs(params)
        if "structured_outputs" in kwargs:
            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        return token_prompt(prompt), VllmSamplingParams(**kwargs, output_kind=kind), unique_id

    def _started(self, prompt: Sequence[int], params: SamplingParams) -> float:
        self._in_flight += 1
        metrics.RUNNING.set(self._in_flight)
        metrics.PROMPT_TOKENS.inc(len(prompt) * params.n)
        return time.perf_counter()

    def _ended(self, started: float, reasons: Sequence[str], tokens: int) -> None:
        self._in_flight -= 1
        now = time.perf_counter()
        metrics.RUNNING.set(self._in_flight)
        metrics.GENERATED_TOKENS.inc(tokens)
        metrics.REQUEST_LATENCY.observe(now - started)
        for reason in reasons:
            metrics.COMPLETIONS.labels(reason).inc()
        self._meter.add(now, tokens)

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        params = GenerationParams.of(params)
        vllm_prompt, vllm_params, unique_id = self._request(prompt, params, request_id, delta=False)
        version_start = self._version
        started = self._started(prompt, params)
        final = None
        completions: list[Completion] = []
        try:
            async for output in self._llm.generate(vllm_prompt, vllm_params, unique_id):
                final = output
            ordered = sorted(final.outputs, key=lambda o: o.index)
            completions = [
                completion_from_output(o, version_start, self._version, params.top_logprobs) for o in ordered
            ]
            return completions
        finally:
            self._ended(
                started,
                [c.finish_reason for c in completions] or ["abort"] * params.n,
                sum(len(c.token_ids) for c in completions),
            )

    async def stream(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> AsyncGenerator[list[StreamDelta], None]:
        params = GenerationParams.of(params)
        vllm_prompt, vllm_params, unique_id = self._request(prompt, params, request_id, delta=True)
        started = self._started(prompt, params)
        reasons: list[str] = []
        tokens = 0
        try:
            async for output in self._llm.generate(vllm_prompt, vllm_params, unique_id):
                deltas = [delta_from_output(o, params.top_logprobs) for o in output.outputs]
                tokens += sum(len(d.token_ids) for d in deltas)
                reasons += [d.finish_reason for d in deltas if d.finish_reason is not None]
                yield deltas
        finally:
            self._ended(started, reasons or ["abort"] * params.n, tokens)

    async def score(
        self, token_ids: Sequence[int], start: int, temperature: float, top_logprobs: int = 0
    ) -> ScoreResult:
        if temperature not in (0.0, 1.0):
            raise RequestError("temperature", "the vllm engine scores at temperature 1 only (0 means 1)")
        if len(token_ids) >= self.max_model_len:
            raise RequestError("token_ids", f"the vllm engine scores at most {self.max_model_len - 1} tokens")
        from vllm import SamplingParams as VllmSamplingParams

        params = VllmSamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=top_logprobs, detokenize=False
        )
        final = None
        async for output in self._llm.generate(token_prompt(token_ids), params, f"score-{uuid.uuid4().hex}"):
            final = output
        return ScoreResult(
            prompt_scores(token_ids, start, final.prompt_logprobs),
            self._version,
            top_logprobs_of(final.prompt_logprobs[start:], top_logprobs),
        )

    def weight_specs(self) -> dict[str, torch.Tensor]:
        return self._specs

    async def update_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> float:
        started = time.perf_counter()
        payload = await asyncio.to_thread(tensor_payload, tensors)
        await self._llm.collective_rpc("rlrun_load_weights", args=(payload,))
        await self._llm.reset_prefix_cache()
        return self._applied(version, started)

    async def receive_weights_nccl(self, header: WeightUpdateHeader) -> float:
        specs = nccl_tensor_specs(header, self._specs)
        rendezvous = header.nccl
        assert rendezvous is not None  # the stream's receiver refused an nccl header without it
        group = (
            rendezvous.host,
            rendezvous.port,
            rendezvous.world_size,
            rendezvous.rank,
            rendezvous.group_name,
        )
        started = time.perf_counter()
        if group != self._nccl_group:
            log.info(
                "joining weight-broadcast group %s at %s:%d as rank %d of %d",
                rendezvous.group_name,
                rendezvous.host,
                rendezvous.port,
                rendezvous.rank,
                rendezvous.world_size,
            )
            await self._llm.collective_rpc(
                "rlrun_join_weight_group",
                args=(rendezvous.host, rendezvous.port, rendezvous.world_size, rendezvous.rank),
            )
            self._nccl_group = group
        await self._llm.collective_rpc("rlrun_receive_weights", args=(specs,))
        await self._llm.reset_prefix_cache()
        return self._applied(header.version, started)

    def _applied(self, version: int, started: float) -> float:
        self._version = version
        metrics.POLICY_VERSION.set(version)
        seconds = time.perf_counter() - started
        metrics.WEIGHT_APPLY_SECONDS.observe(seconds)
        return seconds

    def weight_sync_info(self) -> WeightSyncInfo:
        """vLLM's workers take updates over gRPC or join vLLM's own NCCL communicator
        (`vllm_worker`), so the trainer's `auto` picks the communicator from a CUDA trainer."""
        return WeightSyncInfo(node_id(), "cuda", ["grpc", "nccl"], ["pynccl"])

    def status(self) -> InferenceStatus:
        return self._status(
            running=self._in_flight,
            waiting=0,
            tokens_per_s=self._meter.rate(time.perf_counter()),
            paused=self._paused,
        )

    async def pause(self) -> None:
        # "keep": running requests are frozen in the scheduler, not aborted.
        await self._llm.pause_generation(mode="keep", clear_cache=False)
        self._paused = True

    async def resume(self) -> None:
        await self._llm.resume_generation()
        self._paused = False


def create_engine(config: RunConfig) -> VllmEngine:
    """The engine `rlrun serve inference` runs for `inference.engine = "vllm"`."""
    return VllmEngine(config)
