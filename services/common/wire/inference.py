"""rlrun/v1/inference.proto: the InferenceService's messages in process, shared by its servicer
and every client (the env-server's generation client, reference scoring, status polls)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlrun.common.tokenizer import ChatMessage
from rlrun.common.wire import WireError
from rlrun.common.wire.limits import RequestLimits
from rlrun.common.wire.plan import TokenizerInfo, tokenizer_info_from_proto, tokenizer_info_to_proto
from rlrun.common.wire.sampling import SamplingParams, sampling_from_proto, sampling_to_proto
from rlrun.common.wire.weights import WeightSyncInfo, sync_info_from_proto, sync_info_to_proto
from rlrun.v1 import inference_pb2

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name

FinishReason = Literal["stop", "length", "abort"]

TopLogprobs = list[tuple[int, float]]
"""The most likely tokens at one position with their logprobs, most likely first."""


@dataclass
class Completion:
    """One sample of a request: what the engine returns and the harness sees."""

    token_ids: list[int]
    logprobs: list[float]
    """One per token: the logprob under the distribution actually sampled from."""
    finish_reason: FinishReason
    """`stop`: a stop token ended it (and is its last token); `length`: the token budget did;
    `abort`: the request was cancelled."""
    policy_version_start: int = 0
    """The policy version the replica that sampled it held at its first token."""
    policy_version_end: int = 0
    """... and at its last."""
    top_logprobs: list[TopLogprobs] | None = None
    """Per sampled token, when an OpenAI request asked for `top_logprobs` (not on the gRPC
    wire): under the same distribution as `logprobs`."""


_FINISH_TO_PB: dict[FinishReason, inference_pb2.FinishReason] = {
    "stop": inference_pb2.FINISH_REASON_STOP,
    "length": inference_pb2.FINISH_REASON_LENGTH,
    "abort": inference_pb2.FINISH_REASON_ABORT,
}
_FINISH_FROM_PB: dict[int, FinishReason] = {v: k for k, v in _FINISH_TO_PB.items()}


def check_token_count(token_ids: Sequence[int], field: str, max_len: int) -> None:
    """At most `max_len` ids (checked on the message too, before its ids are read)."""
    if len(token_ids) > max_len:
        raise WireError(field, f"{field} has {len(token_ids)} tokens; the context holds {max_len}")


def check_token_ids(token_ids: Sequence[int], field: str, vocab_size: int, max_len: int) -> None:
    """Non-empty, every id in [0, vocab_size), at most `max_len` ids."""
    if len(token_ids) == 0:
        raise WireError(field, f"{field} must not be empty")
    check_token_count(token_ids, field, max_len)
    for i, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise WireError(
                f"{field}[{i}]", f"{field}[{i}] = {token} is outside the vocabulary [0, {vocab_size})"
            )


# ---- Generate ---------------------------------------------------------------------------


@dataclass
class GenerateRequest:
    prompt_token_ids: list[int]
    sampling: SamplingParams
    request_id: str = ""


def generate_request_to_proto(request: GenerateRequest) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        sampling=sampling_to_proto(request.sampling),
    )


def generate_request_from_proto(
    msg: inference_pb2.GenerateRequest, *, vocab_size: int, max_model_len: int, limits: RequestLimits
) -> GenerateRequest:
    """A prompt that leaves room for one token and sampling that fits the context and
    `limits.max_samples`."""
    check_token_count(msg.prompt_token_ids, "prompt_token_ids", max_model_len - 1)
    prompt = list(msg.prompt_token_ids)
    check_token_ids(prompt, "prompt_token_ids", vocab_size, max_model_len - 1)
    sampling = sampling_from_proto(
        msg.sampling,
        "sampling",
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        prompt_len=len(prompt),
        max_samples=limits.max_samples,
    )
    return GenerateRequest(prompt, sampling, msg.request_id)


def completion_to_proto(completion: Completion) -> inference_pb2.Completion:
    return inference_pb2.Completion(
        token_ids=completion.token_ids,
        logprobs=completion.logprobs,
        finish_reason=_FINISH_TO_PB[completion.finish_reason],
        policy_version_start=completion.policy_version_start,
        policy_version_end=completion.policy_version_end,
    )


def generate_response_to_proto(
    completions: Sequence[Completion], prompt_tokens: int
) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        completions=[completion_to_proto(c) for c in completions], prompt_tokens=prompt_tokens
    )


def completions_from_proto(msgs: Sequence[inference_pb2.Completion], n: int, where: str) -> list[Completion]:
    """The token contract of a reply's completions: `n` of them, each with a finish reason, one
    logprob (a finite number <= 0) per token, non-negative token ids (a model's vocabulary is
    often padded beyond its tokenizer's: ids from the padding are valid model output) and
    ordered policy versions. An aborted completion is returned as such, unchecked."""
    if len(msgs) != n:
        raise WireError(f"{where}.completions", f"{where} returned {len(msgs)} completions for n = {n}")
    out = []
    for i, c in enumerate(msgs):
        at = f"{where} completions[{i}]"
        if c.finish_reason == inference_pb2.FINISH_REASON_ABORT:
            out.append(Completion(list(c.token_ids), list(c.logprobs), "abort"))
            continue
        if c.finish_reason not in _FINISH_FROM_PB:
            raise WireError(f"{at}.finish_reason", f"{at} has no finish reason")
        if len(c.logprobs) != len(c.token_ids):
            raise WireError(
                f"{at}.logprobs", f"{at} has {len(c.logprobs)} logprobs for {len(c.token_ids)} tokens"
            )
        if any(t < 0 for t in c.token_ids):
            raise WireError(f"{at}.token_ids", f"{at} has a negative token id")
        if any(not (math.isfinite(lp) and lp <= 0.0) for lp in c.logprobs):
            raise WireError(f"{at}.logprobs", f"{at} has a logprob that is not a finite number <= 0")
        if c.policy_version_start > c.policy_version_end:
            raise WireError(f"{at}.policy_version_start", f"{at} policy_version_start > policy_version_end")
        out.append(
            Completion(
                list(c.token_ids),
                list(c.logprobs),
                _FINISH_FROM_PB[c.finish_reason],
                c.policy_version_start,
                c.policy_version_end,
            )
        )
    return out


def generate_response_from_proto(msg: inference_pb2.GenerateResponse, n: int, where: str) -> list[Completion]:
    return completions_from_proto(msg.completions, n, where)


# ---- the text-level RPCs ----------------------------------------------------------------


def chat_messages_to_proto(messages: Sequence[ChatMessage]) -> list[inference_pb2.ChatMessage]:
    return [inference_pb2.ChatMessage(role=m.role, content=m.content) for m in messages]


def chat_messages_from_proto(
    msgs: Sequence[inference_pb2.ChatMessage], limits: RequestLimits
) -> list[ChatMessage]:
    """At most `limits.max_messages`, each of at most `limits.max_text_chars`; roles are the
    receiver's to check (it knows its chat format's)."""
    limits.check("messages", len(msgs), "max_messages", "messages")
    for i, m in enumerate(msgs):
        limits.check(f"messages[{i}].content", len(m.content), "max_text_chars", "characters")
    return [ChatMessage(m.role, m.content) for m in msgs]


@dataclass
class RenderChatRequest:
    messages: list[ChatMessage]
    add_generation_prompt: bool = False


def render_chat_request_from_proto(
    msg: inference_pb2.RenderChatRequest, limits: RequestLimits
) -> RenderChatRequest:
    return RenderChatRequest(chat_messages_from_proto(msg.messages, limits), msg.add_generation_prompt)


@dataclass
class RenderedChat:
    messages: list[list[int]]
    """Per message, its token ids (header, content, end-of-message token)."""
    generation_prompt: list[int]
    """The assistant header; empty unless asked for."""

    @property
    def token_ids(self) -> list[int]:
        return [t for ids in self.messages for t in ids] + self.generation_prompt


def rendered_chat_to_proto(rendered: RenderedChat) -> inference_pb2.RenderChatResponse:
    return inference_pb2.RenderChatResponse(
        messages=[inference_pb2.RenderedMessage(token_ids=ids) for ids in rendered.messages],
        generation_prompt=rendered.generation_prompt,
        token_ids=rendered.token_ids,
    )


@dataclass
class GenerateChatRequest:
    messages: list[ChatMessage]
    sampling: SamplingParams
    request_id: str = ""


def generate_chat_request_from_proto(
    msg: inference_pb2.GenerateChatRequest, *, vocab_size: int, limits: RequestLimits
) -> GenerateChatRequest:
    """The messages and the sampling within `limits`, the sampling against the vocabulary;
    the context is checked once the messages are rendered."""
    messages = chat_messages_from_proto(msg.messages, limits)
    sampling = sampling_from_proto(
        msg.sampling, "sampling", vocab_size=vocab_size, max_samples=limits.max_samples
    )
    return GenerateChatRequest(messages, sampling, msg.request_id)


@dataclass
class ChatCompletion:
    completion: Completion
    text: str
    """The completion's text, special tokens left out."""


def generate_chat_response_to_proto(
    prompt: RenderedChat, completions: Sequence[ChatCompletion]
) -> inference_pb2.GenerateChatResponse:
    return inference_pb2.GenerateChatResponse(
        prompt=rendered_chat_to_proto(prompt),
        completions=[
            inference_pb2.ChatCompletion(completion=completion_to_proto(c.completion), text=c.text)
            for c in completions
        ],
    )


def tokenize_request_from_proto(msg: inference_pb2.TokenizeRequest, limits: RequestLimits) -> str:
    limits.check("text", len(msg.text), "max_text_chars", "characters")
    return msg.text


def tokenize_response_to_proto(token_ids: Sequence[int]) -> inference_pb2.TokenizeResponse:
    return inference_pb2.TokenizeResponse(token_ids=token_ids)


@dataclass
class DetokenizeRequest:
    token_ids: list[int]
    skip_special_tokens: bool = False


def detokenize_request_from_proto(
    msg: inference_pb2.DetokenizeRequest, max_model_len: int
) -> DetokenizeRequest:
    """At most a context's worth of ids (no sequence of the model is longer)."""
    check_token_count(msg.token_ids, "token_ids", max_model_len)
    return DetokenizeRequest(list(msg.token_ids), msg.skip_special_tokens)


def detokenize_request_to_proto(request: DetokenizeRequest) -> inference_pb2.DetokenizeRequest:
    return inference_pb2.DetokenizeRequest(
        token_ids=request.token_ids, skip_special_tokens=request.skip_special_tokens
    )


def detokenize_response_to_proto(text: str) -> inference_pb2.DetokenizeResponse:
    return inference_pb2.DetokenizeResponse(text=text)


def detokenize_response_from_proto(msg: inference_pb2.DetokenizeResponse) -> str:
    return msg.text


# ---- Score ------------------------------------------------------------------------------


@dataclass
class ScoreRequest:
    token_ids: list[int]
    start: int
    """Score the tokens at positions [start, len(token_ids))."""
    temperature: float
    """Logits are divided by it before the softmax; 0 means 1."""


def check_score(
    token_ids: Sequence[int], start: int, temperature: float, *, vocab_size: int, max_model_len: int
) -> None:
    check_token_ids(token_ids, "token_ids", vocab_size, max_model_len)
    if not 1 <= start < len(token_ids):
        raise WireError(
            "start", f"start must be in [1, {len(token_ids)}) for {len(token_ids)} tokens, got {start}"
        )
    if not math.isfinite(temperature) or temperature < 0:
        raise WireError("temperature", f"temperature must be a finite number >= 0, got {temperature}")


def score_request_to_proto(request: ScoreRequest) -> inference_pb2.ScoreRequest:
    return inference_pb2.ScoreRequest(
        token_ids=request.token_ids, start=request.start, temperature=request.temperature
    )


def score_request_from_proto(
    msg: inference_pb2.ScoreRequest, *, vocab_size: int, max_model_len: int
) -> ScoreRequest:
    check_token_count(msg.token_ids, "token_ids", max_model_len)
    request = ScoreRequest(list(msg.token_ids), msg.start, msg.temperature)
    check_score(
        request.token_ids,
        request.start,
        request.temperature,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
    )
    return request


@dataclass
class ScoreResult:
    logprobs: list[float]
    policy_version: int
    top_logprobs: list[TopLogprobs] | None = None
    """Per scored token, when an OpenAI request asked for them (not on the gRPC wire)."""


def score_response_to_proto(result: ScoreResult) -> inference_pb2.ScoreResponse:
    return inference_pb2.ScoreResponse(logprobs=result.logprobs, policy_version=result.policy_version)


def score_response_from_proto(
    msg: inference_pb2.ScoreResponse, request: ScoreRequest, where: str
) -> ScoreResult:
    """One logprob per scored token (len(token_ids) - start)."""
    expected = len(request.token_ids) - request.start
    if len(msg.logprobs) != expected:
        raise WireError(
            f"{where}.logprobs",
            f"{where} returned {len(msg.logprobs)} logprobs, expected {expected} (len(token_ids) - start)",
        )
    return ScoreResult(list(msg.logprobs), msg.policy_version)


# ---- UpdateWeights, GetStatus, Pause, Resume ---------------------------------------------


@dataclass
class WeightsApplied:
    """UpdateWeights' reply: the version now served and what the update took."""

    version: int
    bytes_received: int
    apply_seconds: float = 0.0


def weights_applied_to_proto(applied: WeightsApplied) -> inference_pb2.UpdateWeightsResponse:
    return inference_pb2.UpdateWeightsResponse(
        version=applied.version, bytes_received=applied.bytes_received, apply_seconds=applied.apply_seconds
    )


def weights_applied_from_proto(msg: inference_pb2.UpdateWeightsResponse) -> WeightsApplied:
    return WeightsApplied(msg.version, msg.bytes_received, msg.apply_seconds)


@dataclass
class InferenceStatus:
    policy_version: int
    running_requests: int = 0
    waiting_requests: int = 0
    tokens_per_s: float = 0.0
    paused: bool = False
    model: str = ""
    engine: str = ""
    max_model_len: int = 0
    tokenizer: TokenizerInfo = field(default_factory=TokenizerInfo)
    """The tokenizer and chat format this replica serves."""
    weight_sync: WeightSyncInfo = field(default_factory=WeightSyncInfo)
    """How this replica can take weight updates."""


def status_request() -> inference_pb2.GetInferenceStatusRequest:
    return inference_pb2.GetInferenceStatusRequest()


def status_to_proto(status: InferenceStatus) -> inference_pb2.GetInferenceStatusResponse:
    return inference_pb2.GetInferenceStatusResponse(
        policy_version=status.policy_version,
        running_requests=status.running_requests,
        waiting_requests=status.waiting_requests,
        tokens_per_s=status.tokens_per_s,
        paused=status.paused,
        model=status.model,
        engine=status.engine,
        max_model_len=status.max_model_len,
        tokenizer=tokenizer_info_to_proto(status.tokenizer),
        weight_sync=sync_info_to_proto(status.weight_sync),
    )


def status_from_proto(msg: inference_pb2.GetInferenceStatusResponse) -> InferenceStatus:
    return InferenceStatus(
        policy_version=msg.policy_version,
        running_requests=msg.running_requests,
        waiting_requests=msg.waiting_requests,
        tokens_per_s=msg.tokens_per_s,
        paused=msg.paused,
        model=msg.model,
        engine=msg.engine,
        max_model_len=msg.max_model_len,
        tokenizer=tokenizer_info_from_proto(msg.tokenizer),
        weight_sync=sync_info_from_proto(msg.weight_sync),
    )


def pause_response_to_proto(paused: bool) -> inference_pb2.PauseResponse:
    return inference_pb2.PauseResponse(paused=paused)


def resume_response_to_proto(paused: bool) -> inference_pb2.ResumeResponse:
    return inference_pb2.ResumeResponse(paused=paused)
