"""The interface every generation engine implements, and the dataclasses it streams
(the ones it returns are the wire's, `rlrun.common.wire.inference`).

The gRPC servicer and the OpenAI-compatible app only ever talk to an `Engine`; proto
messages stay at those boundaries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from rlrun.common.errors import RequestError
from rlrun.common.wire.inference import Completion, FinishReason, InferenceStatus, ScoreResult, TopLogprobs
from rlrun.common.wire.sampling import SamplingParams
from rlrun.common.wire.weights import WeightSyncInfo, WeightUpdateHeader


@dataclass
class StreamDelta:
    """New tokens of sample `index` since the previous delta; `finish_reason` on its last one."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None
    top_logprobs: list[TopLogprobs] | None = None


def check_version_order(version: int, served: int) -> None:
    """A weight update may not take the served policy back to an older version."""
    if version < served:
        raise RequestError(
            "header.version", f"header.version {version} is older than the served version {served}"
        )


class QueueFullError(Exception):
    """More sequences are waiting than `inference.max_waiting` allows (RESOURCE_EXHAUSTED)."""


class Engine(ABC):
    """Generation, scoring and weight updates for one model replica.

    Every method is called from the asyncio loop of the service. Requests are validated
    by the caller (see `rlrun.inference.validation`) before they reach an engine.
    """

    name: str
    model_name: str
    vocab_size: int
    max_model_len: int
    structured_outputs: bool = False
    """Whether it follows the `json_schema` knob (the OpenAI API refuses it otherwise)."""
    on_dead: Callable[[Exception], None] | None = None
    """Called once if the engine dies without being asked to stop (its thread or process is
    gone); the service then stops, so that the replica is restarted."""

    @abstractmethod
    async def start(self) -> None:
        """Loads the model; the engine serves once this returns."""

    @abstractmethod
    async def stop(self) -> None:
        """Aborts whatever is in flight and releases the model."""

    @property
    @abstractmethod
    def policy_version(self) -> int: ...

    @abstractmethod
    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        """`params.n` completions of `prompt` (`params` may be `GenerationParams`, with the
        OpenAI API's own settings). Cancelling the awaiting task frees the request's
        batch slots at the next step boundary."""

    @abstractmethod
    def stream(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> AsyncGenerator[list[StreamDelta], None]:
        """Like `generate`, but yields the new tokens of every sample as they are decoded.
        Closing the generator early (`aclose`) aborts the request."""

    @abstractmethod
    async def score(
        self, token_ids: Sequence[int], start: int, temperature: float, top_logprobs: int = 0
    ) -> ScoreResult:
        """Logprobs of token_ids[start:] given their prefixes, under softmax(logits / temperature),
        and with `top_logprobs`, the most likely tokens at each of those positions."""

    @abstractmethod
    def weight_specs(self) -> dict[str, torch.Tensor]:
        """The tensors a weight update must carry, by Hugging Face name (dtype and shape are
        what counts; the values may live on the meta device)."""

    async def weight_receive_buffer(self) -> memoryview | None:
        """Where an update over gRPC is best assembled (it saves a copy), sized exactly for
        the model's tensors; None: anywhere. Only one update uses it at a time; it is
        returned once the previous update has been copied out of it."""
        return None

    @abstractmethod
    async def update_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Applies a complete, checked update atomically between two decode steps and sets
        the policy version. Returns once the update is committed: from then on it can no
        longer fail, `policy_version` is `version`, and every request that arrives is served
        by it (an engine may still be copying it in, ahead of any such request). Returns the
        seconds from the call to the commit. On any error nothing changes."""

    @abstractmethod
    async def receive_weights_nccl(self, header: WeightUpdateHeader) -> float:
        """Joins the NCCL group the header names (once) and receives the announced tensors from
        rank 0 of it; applied atomically like `update_weights`."""

    async def receive_weights_ipc(self, header: WeightUpdateHeader) -> float:
        """Maps the trainer's staging buffer the header names (`header.ipc`) and copies the
        announced tensors from it, atomically like `update_weights`; returns once the copy is
        done, since the trainer then reuses the buffer."""
        raise RequestError("header.transport", f"the {self.name} engine takes no IPC weight updates")

    def weight_sync_info(self) -> WeightSyncInfo:
        """What this replica tells the trainer for choosing a weight transport (GetStatus)."""
        return WeightSyncInfo(transports=["grpc"])

    @abstractmethod
    def status(self) -> InferenceStatus: ...

    def _status(self, *, running: int, waiting: int, tokens_per_s: float, paused: bool) -> InferenceStatus:
        """The status less what the service adds (its tokenizer, the engine's weight sync)."""
        return InferenceStatus(
            policy_version=self.policy_version,
            running_requests=running,
            waiting_requests=waiting,
            tokens_per_s=tokens_per_s,
            paused=paused,
            model=self.model_name,
            engine=self.name,
            max_model_len=self.max_model_len,
        )

    @abstractmethod
    async def pause(self) -> None:
        """No decode step runs until `resume`; running requests are held, not aborted."""

    @abstractmethod
    async def resume(self) -> None: ...
