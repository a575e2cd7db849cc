"""The torch engine: continuous batching over a slot KV cache, on CPU or any torch device.

One engine thread owns the model. Each step is one forward over every running sequence's
next token plus the prompts of newly admitted sequences (samples of one request share a
single prefill, whose K/V is then copied into their sibling slots), followed by one
batched sampling call. Between steps the thread runs what the asyncio side posted
(cancellations, score batches), so a cancelled request gives its slots back before the next
step. Each step holds the step lock; a weight update copies into the parameters under that
lock, so it lands atomically between two decode steps. Results go back to the asyncio loop
in one `call_soon_threadsafe` per step.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from rlrun.common.config import RunConfig
from rlrun.common.errors import RequestError
from rlrun.common.model import CausalLM, PackedCausal, SlotKVCache, build_model
from rlrun.common.model.weights import broadcast_tensors
from rlrun.common.types import SamplingParams
from rlrun.inference import metrics
from rlrun.inference.engines.base import (
    Completion,
    Engine,
    EngineStatus,
    FinishReason,
    ScoreResult,
    StreamDelta,
)
from rlrun.inference.sampler import BatchSampler, RowSettings
from rlrun.inference.scheduler import Admission, SlotScheduler
from rlrun.inference.throughput import ThroughputMeter
from rlrun.v1 import weights_pb2

log = logging.getLogger(__name__)

_STREAM_END = object()


@dataclass(eq=False)
class _Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    arrival: float
    future: asyncio.Future | None
    queue: asyncio.Queue | None
    completions: list[Completion | None]
    unfinished: int
    running_samples: int = 0
    closed: bool = False
    """Set on the engine thread once the request finished, failed or was cancelled."""


@dataclass(eq=False)
class _Sample:
    request: _Request
    index: int
    slot: int
    settings: RowSettings
    stop_ids: frozenset[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_start: int = 0
    first_token_at: float = 0.0

    def next_position(self) -> int:
        """Where the last sampled token goes in the cache when it is fed back."""
        return len(self.request.prompt) + len(self.tokens) - 1


@dataclass(eq=False)
class _ScoreJob:
    token_ids: list[int]
    start: int
    temperature: float
    future: asyncio.Future


class TorchEngine(Engine):
    name = "torch"

    def __init__(
        self,
        model: CausalLM,
        *,
        model_name: str,
        max_model_len: int,
        max_batch_size: int,
        max_waiting: int,
        seed: int | None = None,
    ):
        self.model = model.eval().requires_grad_(False)
        parameter = next(model.parameters())
        self.device = parameter.device
        cfg = model.config
        self.model_name = model_name
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self._cache = SlotKVCache(
            cfg.num_layers,
            max_batch_size,
            max_model_len,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=parameter.dtype,
            device=self.device,
        )
        self._tensors = broadcast_tensors(self.model)
        self._scheduler: SlotScheduler[_Request] = SlotScheduler(max_batch_size, max_waiting)
        self._running: list[_Sample] = []
        self._sampler: BatchSampler | None = None
        # While the batch stays the same, the next decode step's inputs are the tokens just
        # sampled, the same slots and the positions one further: kept as tensors, so a steady
        # step builds nothing from Python lists.
        self._next_tokens: torch.Tensor | None = None
        self._next_inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed if seed is not None else random.SystemRandom().getrandbits(63))
        self._scores: list[_ScoreJob] = []
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()
        self._update_pending = False
        self._inbox: list[Callable[[], None]] = []
        self._outbox: list[tuple[Callable, tuple]] = []
        self._paused = False
        self._stopping = False
        self._version = 0
        self._running_requests = 0
        self._gauges: tuple[int, int] | None = None
        self._meter = ThroughputMeter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="torch-engine", daemon=True)
        self._thread.start()
        metrics.POLICY_VERSION.set(self._version)

    async def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    @property
    def policy_version(self) -> int:
        return self._version

    # -- requests (asyncio side) -------------------------------------------------------------

    def _submit(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str, streaming: bool
    ) -> _Request:
        loop = asyncio.get_running_loop()
        request = _Request(
            id=request_id,
            prompt=list(prompt),
            params=params,
            arrival=time.perf_counter(),
            future=None if streaming else loop.create_future(),
            queue=asyncio.Queue() if streaming else None,
            completions=[None] * params.n,
            unfinished=params.n,
        )
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is stopping")
            self._scheduler.enqueue(request, params.n)
            self._cond.notify()
        return request

    def _post(self, work: Callable[[], None]) -> None:
        with self._cond:
            self._inbox.append(work)
            self._cond.notify()

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> list[Completion]:
        request = self._submit(prompt, params, request_id, streaming=False)
        try:
            return await request.future
        except asyncio.CancelledError:
            self._post(partial(self._cancel, request))
            raise

    async def stream(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str = ""
    ) -> AsyncIterator[list[StreamDelta]]:
        request = self._submit(prompt, params, request_id, streaming=True)
        finished = False
        try:
            while True:
                item = await request.queue.get()
                if item is _STREAM_END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:
                self._post(partial(self._cancel, request))

    async def score(self, token_ids: Sequence[int], start: int, temperature: float) -> ScoreResult:
        job = _ScoreJob(
            list(token_ids), start, temperature or 1.0, asyncio.get_running_loop().create_future()
        )
        self._post(partial(self._scores.append, job))
        return await job.future

    def weight_specs(self) -> dict[str, torch.Tensor]:
        return self._tensors

    async def update_weights(self, tensors: dict[str, torch.Tensor], version: int) -> float:
        if self.device.type != "cpu":
            tensors = await asyncio.to_thread(lambda: {n: t.to(self.device) for n, t in tensors.items()})
        self._check_update(tensors)
        started = time.perf_counter()
        # Applied right here, under the step lock: no thread hop, and this loop blocks for at
        # most the step in progress. The pending flag keeps the engine thread from taking the
        # lock again before this side gets it.
        with self._cond:
            self._update_pending = True
        try:
            with self._step_lock, torch.no_grad():
                if version < self._version:
                    raise RequestError(
                        "header.version",
                        f"header.version {version} is older than the served version {self._version}",
                    )
                names = list(tensors)
                torch._foreach_copy_([self._tensors[n] for n in names], [tensors[n] for n in names])
                self._version = version
        finally:
            with self._cond:
                self._update_pending = False
                self._cond.notify()
        metrics.POLICY_VERSION.set(version)
        return time.perf_counter() - started

    def _check_update(self, tensors: dict[str, torch.Tensor]) -> None:
        """Every check before the first copy, so that the copies cannot fail half-way."""
        for name, tensor in tensors.items():
            target = self._tensors.get(name)
            if target is None or target.shape != tensor.shape or target.dtype != tensor.dtype:
                raise RequestError("header.tensors", f"tensor {name} does not match the model")
        if set(tensors) != set(self._tensors):
            raise RequestError("header.tensors", "the update does not carry every tensor of the model")

    async def receive_weights_nccl(self, header: weights_pb2.WeightUpdateHeader) -> float:
        raise RequestError(
            "header.transport",
            "the torch engine receives weights over gRPC only "
            "(WEIGHT_TRANSPORT_GRPC); NCCL needs inference.engine = 'vllm'",
        )

    def status(self) -> EngineStatus:
        return EngineStatus(
            policy_version=self._version,
            running_requests=self._running_requests,
            waiting_requests=self._scheduler.waiting_requests,
            tokens_per_s=self._meter.rate(time.perf_counter()),
            paused=self._paused,
            model=self.model_name,
            engine=self.name,
            max_model_len=self.max_model_len,
        )

    async def pause(self) -> None:
        with self._cond:
            self._paused = True

    async def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify()

    # -- engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                self._serve_steps()
            self._abort_all()
        except BaseException as error:  # a bug in the engine itself: nothing may wait forever on it
            log.exception("the engine thread crashed; failing every open request")
            with self._cond:
                self._stopping = True
            failure = error if isinstance(error, Exception) else RuntimeError("the engine thread crashed")
            self._fail_all(failure)
            for job in self._scores:
                self._outbox.append((_fail, (job.future, failure)))
            raise
        finally:
            self._flush()

    def _serve_steps(self) -> None:
        while True:
            with self._cond:
                while self._update_pending or not (
                    self._stopping
                    or self._inbox
                    or self._scores
                    or (not self._paused and (self._running or self._scheduler.waiting_samples))
                ):
                    self._cond.wait()
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, []
                decode = not self._paused
            with self._step_lock:
                for work in inbox:
                    work()
                if self._scores:
                    self._score_batch()
                if decode and (self._running or self._scheduler.waiting_samples):
                    try:
                        self._step()
                    except Exception as error:  # a bug, not bad input: fail loudly to every caller
                        log.exception("decode step failed; failing every running and waiting request")
                        self._fail_all(error)
            self._flush()

    def _flush(self) -> None:
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            self._loop.call_soon_threadsafe(_deliver, outbox)

    def _batch_changed(self) -> None:
        self._sampler = None
        self._next_inputs = None

    def _step(self) -> None:
        with self._cond:
            admissions = self._scheduler.admit()
        if not admissions and self._next_inputs is not None:
            self._decode_step()
            return
        decoding = self._running
        ids = [s.tokens[-1] for s in decoding]
        positions = [s.next_position() for s in decoding]
        slots = [s.slot for s in decoding]
        keep = list(range(len(decoding)))
        new_samples: list[_Sample] = []
        for admission in admissions:
            request = admission.key
            length = len(request.prompt)
            ids += request.prompt
            positions += range(length)
            slots += [admission.slots[0]] * length
            keep += [len(ids) - 1] * len(admission.slots)
            new_samples += self._new_samples(admission)
        if admissions:
            # In the batch before the forward, so a failing step still frees their slots.
            self._running = decoding + new_samples
            self._batch_changed()
            metrics.PROMPT_TOKENS.inc(sum(len(a.key.prompt) * len(a.slots) for a in admissions))
        input_ids = torch.tensor(ids, device=self.device)
        position_ids = torch.tensor(positions, device=self.device)
        slot_ids = torch.tensor(slots, device=self.device)
        hidden = self.model.hidden_states(input_ids, position_ids, self._cache.step(slot_ids, position_ids))
        if admissions:
            hidden = hidden.index_select(0, torch.tensor(keep, device=self.device))
            self._fan_out_prefixes(admissions)
        logits = self.model.lm_head(hidden)
        if self._sampler is None:
            self._sampler = BatchSampler([s.settings for s in self._running], self.device)
        tokens, logprobs = self._sampler.sample(logits, self._generator)
        self._record(tokens.tolist(), logprobs.tolist())
        if not admissions and self._sampler is not None:
            self._next_tokens = tokens
            self._next_inputs = (slot_ids, position_ids + 1)

    def _decode_step(self) -> None:
        """A step over an unchanged batch: every input is already a tensor."""
        slot_ids, position_ids = self._next_inputs
        hidden = self.model.hidden_states(
            self._next_tokens, position_ids, self._cache.step(slot_ids, position_ids)
        )
        tokens, logprobs = self._sampler.sample(self.model.lm_head(hidden), self._generator)
        self._record(tokens.tolist(), logprobs.tolist())
        if self._sampler is not None:
            self._next_tokens = tokens
            self._next_inputs = (slot_ids, position_ids + 1)

    def _new_samples(self, admission: Admission[_Request]) -> list[_Sample]:
        request = admission.key
        params = request.params
        if request.running_samples == 0:
            self._running_requests += 1
        request.running_samples += len(admission.slots)
        samples = []
        for offset, slot in enumerate(admission.slots):
            index = admission.first_index + offset
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed * 1_000_003 + index)
            settings = RowSettings(params.temperature, params.top_k, params.top_p, generator)
            samples.append(
                _Sample(request, index, slot, settings, frozenset(params.stop_token_ids), params.max_tokens)
            )
        return samples

    def _fan_out_prefixes(self, admissions: list[Admission[_Request]]) -> None:
        """Siblings admitted together were prefilled once, in their first slot."""
        for admission in admissions:
            if len(admission.slots) == 1:
                continue
            length = len(admission.key.prompt)
            source = admission.slots[0]
            targets = torch.tensor(admission.slots[1:], device=self.device)
            for store in (*self._cache.k, *self._cache.v):
                store[targets, :length] = store[source, :length]

    def _record(self, tokens: list[int], logprobs: list[float]) -> None:
        now = time.perf_counter()
        version = self._version
        finished: list[tuple[_Sample, FinishReason]] = []
        deltas: dict[_Request, list[StreamDelta]] | None = None
        for sample, token, logprob in zip(self._running, tokens, logprobs, strict=True):
            sample_tokens = sample.tokens
            if not sample_tokens:
                sample.version_start = version
                sample.first_token_at = now
                metrics.TIME_TO_FIRST_TOKEN.observe(now - sample.request.arrival)
            sample_tokens.append(token)
            sample.logprobs.append(logprob)
            reason: FinishReason | None = None
            if token in sample.stop_ids:
                reason = "stop"
            elif len(sample_tokens) >= sample.max_tokens:
                reason = "length"
            if sample.request.queue is not None:
                if deltas is None:
                    deltas = {}
                deltas.setdefault(sample.request, []).append(
                    StreamDelta(sample.index, [token], [logprob], reason)
                )
            if reason is not None:
                finished.append((sample, reason))
        metrics.GENERATED_TOKENS.inc(len(tokens))
        metrics.STEPS.inc()
        self._meter.add(now, len(tokens))
        if deltas:
            for request, items in deltas.items():
                self._outbox.append((request.queue.put_nowait, (items,)))
        if finished:
            done = {id(s) for s, _ in finished}
            self._running = [s for s in self._running if id(s) not in done]
            self._batch_changed()
            for sample, reason in finished:
                self._finish(sample, reason, version, now)
        self._set_gauges()

    def _set_gauges(self) -> None:
        gauges = (self._running_requests, self._scheduler.waiting_requests)
        if gauges != self._gauges:  # set only on change: each set takes the metric's lock
            self._gauges = gauges
            metrics.RUNNING.set(gauges[0])
            metrics.WAITING.set(gauges[1])

    def _finish(self, sample: _Sample, reason: FinishReason, version: int, now: float) -> None:
        with self._cond:
            self._scheduler.release(sample.slot)
        request = sample.request
        request.completions[sample.index] = Completion(
            sample.tokens, sample.logprobs, reason, sample.version_start, version
        )
        _completions(reason).inc()
        if len(sample.tokens) > 1:
            metrics.INTER_TOKEN_LATENCY.observe((now - sample.first_token_at) / (len(sample.tokens) - 1))
        request.running_samples -= 1
        if request.running_samples == 0:
            self._running_requests -= 1
        request.unfinished -= 1
        if request.unfinished == 0:
            request.closed = True
            metrics.REQUEST_LATENCY.observe(now - request.arrival)
            if request.future is not None:
                self._outbox.append((_resolve, (request.future, request.completions)))
            else:
                self._outbox.append((request.queue.put_nowait, (_STREAM_END,)))

    def _cancel(self, request: _Request) -> None:
        if request.closed:
            return
        log.debug("request %r cancelled", request.id)
        request.closed = True
        with self._cond:
            self._scheduler.drop(request)
        kept = []
        for sample in self._running:
            if sample.request is request:
                with self._cond:
                    self._scheduler.release(sample.slot)
                metrics.COMPLETIONS.labels("abort").inc()
            else:
                kept.append(sample)
        if len(kept) != len(self._running):
            self._running = kept
            self._batch_changed()
            self._running_requests -= 1
        self._set_gauges()

    def _take_open_requests(self) -> list[_Request]:
        """Empties the batch and the queue; returns every request still open, in arrival order."""
        with self._cond:
            open_requests = {id(r): r for r in self._scheduler.drain()}
            for sample in self._running:
                self._scheduler.release(sample.slot)
        for sample in self._running:
            open_requests.setdefault(id(sample.request), sample.request)
        self._running = []
        self._batch_changed()
        self._running_requests = 0
        self._gauges = None
        self._set_gauges()
        return sorted((r for r in open_requests.values() if not r.closed), key=lambda r: r.arrival)

    def _fail_all(self, error: Exception) -> None:
        for request in self._take_open_requests():
            request.closed = True
            if request.future is not None:
                self._outbox.append((_fail, (request.future, error)))
            else:
                self._outbox.append((request.queue.put_nowait, (error,)))

    def _abort_all(self) -> None:
        """On stop: every open request ends with what it has, finish_reason abort."""
        partial_samples = {id(s.request): [] for s in self._running}
        for sample in self._running:
            partial_samples[id(sample.request)].append(sample)
        version = self._version
        for request in self._take_open_requests():
            for sample in partial_samples.get(id(request), []):
                request.completions[sample.index] = Completion(
                    sample.tokens, sample.logprobs, "abort", sample.version_start, version
                )
            for index, completion in enumerate(request.completions):
                if completion is None:
                    request.completions[index] = Completion([], [], "abort", version, version)
            request.closed = True
            if request.future is not None:
                self._outbox.append((_resolve, (request.future, request.completions)))
            else:
                self._outbox.append((request.queue.put_nowait, (_STREAM_END,)))

    def _score_batch(self) -> None:
        jobs, self._scores = self._scores[: self.max_batch_size], self._scores[self.max_batch_size :]
        try:
            lengths = [len(job.token_ids) for job in jobs]
            offsets = [0]
            for length in lengths:
                offsets.append(offsets[-1] + length)
            ids = torch.tensor([t for job in jobs for t in job.token_ids], device=self.device)
            positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])
            attend = PackedCausal(torch.tensor(offsets))
            # Row r predicts token r + 1; job i scores its tokens start .. len - 1.
            rows = [
                r
                for job, base in zip(jobs, offsets, strict=False)
                for r in range(base + job.start - 1, base + len(job.token_ids) - 1)
            ]
            temperatures = [job.temperature for job in jobs for _ in range(job.start, len(job.token_ids))]
            hidden = self.model.hidden_states(ids, positions, attend)
            row_index = torch.tensor(rows, device=self.device)
            logits = self.model.lm_head(hidden.index_select(0, row_index)).float()
            logits = logits / torch.tensor(temperatures, device=self.device)[:, None]
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[row_index + 1][:, None])[:, 0].tolist()
        except Exception as error:
            log.exception("score batch failed")
            for job in jobs:
                self._outbox.append((_fail, (job.future, error)))
            return
        cursor = 0
        for job in jobs:
            count = len(job.token_ids) - job.start
            result = ScoreResult(logprobs[cursor : cursor + count], self._version)
            self._outbox.append((_resolve, (job.future, result)))
            cursor += count


@functools.cache
def _completions(reason: str):
    """The COMPLETIONS child of one finish reason (labels() costs a lookup under a lock)."""
    return metrics.COMPLETIONS.labels(reason)


def _deliver(outbox: list[tuple[Callable, tuple]]) -> None:
    for callback, args in outbox:
        callback(*args)


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def create_engine(config: RunConfig) -> TorchEngine:
    """The engine `rlrun serve inference` runs for `inference.engine = "torch"`."""
    model = build_model(config.model, device=config.inference.device)
    return TorchEngine(
        model,
        model_name=config.name,
        max_model_len=config.model.max_model_len,
        max_batch_size=config.inference.max_batch_size,
        max_waiting=config.inference.max_waiting,
    )
