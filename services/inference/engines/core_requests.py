"""The torch engine core's request bookkeeping: which requests wait and run, their samples and
slots, the tokens each step appends, the completions, and the events and statistics a step
produces. The core (`torch_core.TorchEngineCore`) runs the model; this keeps the books."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlrun.common.errors import RequestError
from rlrun.common.wire.inference import Completion, FinishReason, TopLogprobs
from rlrun.inference.engines.base import QueueFullError, StreamDelta
from rlrun.inference.engines.core_protocol import DELTAS, DONE, END, FAILED, CoreOutput, CoreStats, Submit
from rlrun.inference.engines.core_scoring import top_entries
from rlrun.inference.engines.scheduler import Admission, SlotScheduler
from rlrun.inference.logits import EngineResources, RowState, prepare_knobs, sample_ends
from rlrun.inference.params import GenerationParams
from rlrun.inference.sampler import RowSettings
from rlrun.inference.structured import GrammarCompiler

log = logging.getLogger("rlrun.inference.engines.torch_core")


@dataclass(eq=False)
class Request:
    rid: int
    prompt: list[int]
    params: GenerationParams
    arrival: float
    streaming: bool
    completions: list[Completion | None]
    unfinished: int
    running_samples: int = 0
    knobs: dict[str, Sequence[RowState]] = field(default_factory=dict)
    """Each logits processor's state of each sample (`prepare_knobs`), by name."""


@dataclass(eq=False)
class Sample:
    request: Request
    index: int
    slot: int
    settings: RowSettings
    stop_ids: frozenset[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[TopLogprobs] | None = None
    """Per token, when the request asked for top_logprobs."""
    version_start: int = 0
    first_token_at: float = 0.0

    def next_position(self) -> int:
        """Where the last sampled token goes in the cache when it is fed back."""
        return len(self.request.prompt) + len(self.tokens) - 1


class RequestBook:
    def __init__(self, max_batch_size: int, max_waiting: int):
        self.scheduler: SlotScheduler[Request] = SlotScheduler(max_batch_size, max_waiting)
        self.requests: dict[int, Request] = {}
        self.running: list[Sample] = []
        """The batch: every running sample, in row order."""
        self.events: list[tuple] = []
        self.stats = CoreStats()
        self.running_requests = 0
        self._gauges = (-1, -1)

    def submit(self, command: Submit, grammars: GrammarCompiler | None) -> None:
        params = GenerationParams.of(command.params)
        request = Request(
            rid=command.rid,
            prompt=command.prompt,
            params=params,
            arrival=command.arrival,
            streaming=command.streaming,
            completions=[None] * params.n,
            unfinished=params.n,
        )
        try:
            if params.knobs:
                request.knobs = prepare_knobs(params, EngineResources(grammars))
            self.scheduler.enqueue(request, params.n)
        except (QueueFullError, RequestError) as error:
            self.events.append((FAILED, command.rid, error))
            return
        self.requests[command.rid] = request

    def take_output(self) -> CoreOutput | None:
        """The events and statistics since the last call; None when nothing happened."""
        stats = self.stats
        gauges = (self.running_requests, self.scheduler.waiting_requests)
        if not self.events and not stats.steps and gauges == self._gauges:
            return None
        self._gauges = gauges
        stats.running_requests, stats.waiting_requests = gauges
        output = CoreOutput(self.events, stats)
        self.events, self.stats = [], CoreStats()
        return output

    def new_samples(self, admission: Admission[Request], device: torch.device) -> list[Sample]:
        request = admission.key
        params = request.params
        if request.running_samples == 0:
            self.running_requests += 1
        request.running_samples += len(admission.slots)
        samples = []
        for offset, slot in enumerate(admission.slots):
            index = admission.first_index + offset
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=device)
                generator.manual_seed(params.seed * 1_000_003 + index)
            settings = RowSettings(
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                min_p=params.min_p,
                generator=generator,
                top_logprobs=params.top_logprobs,
                knobs={name: states[index] for name, states in request.knobs.items()},
            )
            samples.append(
                Sample(
                    request,
                    index,
                    slot,
                    settings,
                    frozenset(params.stop_token_ids),
                    params.max_tokens,
                    top=[] if params.top_logprobs else None,
                )
            )
        return samples

    def record(
        self,
        tokens: list[int],
        logprobs: list[float],
        top: tuple[torch.Tensor, torch.Tensor] | None,
        version: int,
    ) -> list[int] | None:
        """Appends each running sample's token, each stamped with `version` (the weights that
        sampled it); returns the rows still running when some finished (None: all carry on)."""
        if top is not None:
            self._record_top(*top)
        now = time.perf_counter()
        stats = self.stats
        finished: list[tuple[Sample, FinishReason]] = []
        deltas: dict[int, list[StreamDelta]] | None = None
        for sample, token, logprob in zip(self.running, tokens, logprobs, strict=True):
            sample_tokens = sample.tokens
            if not sample_tokens:
                sample.version_start = version
                sample.first_token_at = now
                stats.time_to_first_token.append(now - sample.request.arrival)
            sample_tokens.append(token)
            sample.logprobs.append(logprob)
            reason: FinishReason | None = None
            knobs = sample.settings.knobs
            if token in sample.stop_ids or (knobs and sample_ends(knobs, token)):
                reason = "stop"
            elif len(sample_tokens) >= sample.max_tokens:
                reason = "length"
            if sample.request.streaming:
                if deltas is None:
                    deltas = {}
                top_entry = None if sample.top is None else sample.top[-1:]
                deltas.setdefault(sample.request.rid, []).append(
                    StreamDelta(sample.index, [token], [logprob], reason, top_entry)
                )
            if reason is not None:
                finished.append((sample, reason))
        stats.generated_tokens += len(tokens)
        stats.steps += 1
        stats.at = now
        if deltas:
            self.events.extend((DELTAS, rid, items) for rid, items in deltas.items())
        if not finished:
            return None
        done = {id(s) for s, _ in finished}
        kept = [row for row, s in enumerate(self.running) if id(s) not in done]
        self.running = [self.running[row] for row in kept]
        for sample, reason in finished:
            self._finish(sample, reason, version, now)
        return kept

    def _record_top(self, values: torch.Tensor, token_ids: torch.Tensor) -> None:
        """The most likely tokens of this step, for the rows that asked (each its own count)."""
        values, token_ids = values.tolist(), token_ids.tolist()
        for row, sample in enumerate(self.running):
            if sample.top is not None:
                sample.top.append(top_entries(values[row], token_ids[row], sample.settings.top_logprobs))

    def _finish(self, sample: Sample, reason: FinishReason, version: int, now: float) -> None:
        self.scheduler.release(sample.slot)
        request = sample.request
        request.completions[sample.index] = Completion(
            sample.tokens, sample.logprobs, reason, sample.version_start, version, sample.top
        )
        self.stats.finished[reason] += 1
        if len(sample.tokens) > 1:
            self.stats.inter_token_latency.append((now - sample.first_token_at) / (len(sample.tokens) - 1))
        request.running_samples -= 1
        if request.running_samples == 0:
            self.running_requests -= 1
        request.unfinished -= 1
        if request.unfinished == 0:
            del self.requests[request.rid]
            self.stats.request_latency.append(now - request.arrival)
            if request.streaming:
                self.events.append((END, request.rid))
            else:
                self.events.append((DONE, request.rid, request.completions))

    def cancel(self, request: Request) -> bool:
        """Drops the request, waiting or running; whether the batch changed."""
        log.debug("request %d cancelled", request.rid)
        del self.requests[request.rid]
        self.scheduler.drop(request)
        kept = []
        for sample in self.running:
            if sample.request is request:
                self.scheduler.release(sample.slot)
                self.stats.finished["abort"] += 1
            else:
                kept.append(sample)
        changed = len(kept) != len(self.running)
        if changed:
            self.running = kept
            self.running_requests -= 1
        request.running_samples = 0
        return changed

    def take_open_requests(self) -> list[Request]:
        """Empties the batch and the queue; returns every request still open, in arrival order."""
        self.scheduler.drain()
        for sample in self.running:
            self.scheduler.release(sample.slot)
        self.running = []
        self.running_requests = 0
        requests = sorted(self.requests.values(), key=lambda r: r.arrival)
        self.requests = {}
        return requests

    def abort_open_requests(self, version: int) -> None:
        """Every open request ends with what it has, finish_reason abort."""
        partial_samples: dict[int, list[Sample]] = {}
        for sample in self.running:
            partial_samples.setdefault(sample.request.rid, []).append(sample)
        for request in self.take_open_requests():
            for sample in partial_samples.get(request.rid, []):
                request.completions[sample.index] = Completion(
                    sample.tokens, sample.logprobs, "abort", sample.version_start, version, sample.top
                )
            top = [] if request.params.top_logprobs else None
            for index, completion in enumerate(request.completions):
                if completion is None:
                    request.completions[index] = Completion([], [], "abort", version, version, top)
            if request.streaming:
                self.events.append((END, request.rid))
            else:
                self.events.append((DONE, request.rid, request.completions))
