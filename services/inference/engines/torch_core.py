"""The torch engine's core: continuous batching over a slot KV cache, synchronous and
single-threaded.

Commands go in through `handle`; events and statistics come out of `take_output`. `run`
drives a core from a `CoreChannel`: it takes the commands that arrived, runs one step, and
sends what the step produced. The channel is a thread hand-off for the in-process engine
(`torch_engine.TorchEngine`) or a socket to the front end for the engine process
(`torch_process.TorchEngineProcess`); the core knows neither, nor asyncio.

Each step is one forward over every running sequence's next token plus the prompts of newly
admitted sequences (samples of one request share a single prefill, whose K/V is then copied
into their sibling slots), followed by one batched sampling call. Steps without prompts may
run at static shapes, replayed from CUDA graphs on CUDA (`static_decode`). Commands are
handled only between steps, so a cancelled request gives its slots back before the next step
and a weight update lands atomically between two decode steps.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol

import torch

from rlrun.common.errors import RequestError
from rlrun.common.memory import release_memory
from rlrun.common.model import CausalLM, PackedCausal, SlotKVCache
from rlrun.common.weights.protocol import WeightSource, broadcast_tensors
from rlrun.common.wire.inference import Completion, FinishReason, ScoreResult, TopLogprobs
from rlrun.common.wire.sampling import SamplingParams
from rlrun.inference.engines.base import QueueFullError, StreamDelta
from rlrun.inference.engines.scheduler import Admission, SlotScheduler
from rlrun.inference.engines.static_decode import DecodeMode, StaticDecoder
from rlrun.inference.logits import EngineResources, RowState, prepare_knobs, sample_ends
from rlrun.inference.params import GenerationParams
from rlrun.inference.sampler import BatchSampler, RowSettings, Sampled
from rlrun.inference.structured import GrammarCompiler

log = logging.getLogger(__name__)


STATS_INTERVAL_S = 0.05
"""Longest a step's statistics wait for an output that carries answers."""

# -- commands (to the core) -------------------------------------------------------------------


@dataclass
class Submit:
    rid: int
    prompt: list[int]
    params: SamplingParams
    streaming: bool
    arrival: float
    """time.perf_counter() at the front end (CLOCK_MONOTONIC: comparable across processes)."""


@dataclass
class Cancel:
    rid: int


@dataclass
class Score:
    rid: int
    token_ids: list[int]
    start: int
    temperature: float
    top_logprobs: int = 0


@dataclass
class ApplyWeights:
    rid: int
    version: int
    tensors: Mapping[str, torch.Tensor] | WeightSource
    """Every tensor of the model, already checked against it (`CoreClient.update_weights`), or
    where to fetch them from (IPC, a collective): fetched between two steps, then copied in."""


@dataclass
class SetPaused:
    rid: int
    paused: bool


@dataclass
class Stop:
    """Ends `run`: every open request ends with what it has, finish_reason abort."""


# -- events (from the core) -------------------------------------------------------------------

DONE = "done"  # (DONE, rid, value): a request, score, update or pause/resume finished
FAILED = "failed"  # (FAILED, rid, exception)
DELTAS = "deltas"  # (DELTAS, rid, [StreamDelta]): new tokens of a streaming request
END = "end"  # (END, rid): a streaming request finished


@dataclass
class CoreStats:
    """What happened since the previous output; the front end turns it into metrics."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    finished: Counter = field(default_factory=Counter)
    """Finished samples by finish reason."""
    time_to_first_token: list[float] = field(default_factory=list)
    inter_token_latency: list[float] = field(default_factory=list)
    request_latency: list[float] = field(default_factory=list)
    running_requests: int = 0
    waiting_requests: int = 0
    at: float = 0.0
    """Clock reading of the last step (for the tokens/s meter)."""


@dataclass
class CoreOutput:
    events: list[tuple]
    stats: CoreStats


class CoreChannel(Protocol):
    def receive(self, wait: bool) -> list[Any]:
        """The commands that arrived; with `wait`, blocks until there is at least one."""

    def send(self, output: CoreOutput) -> None: ...


@dataclass(eq=False)
class _Request:
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
class _Sample:
    request: _Request
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


class TorchEngineCore:
    def __init__(
        self,
        model: CausalLM,
        *,
        max_model_len: int,
        max_batch_size: int,
        max_waiting: int,
        seed: int | None = None,
        grammars: GrammarCompiler | None = None,
        decode: DecodeMode = "eager",
        graph_batch_sizes: Sequence[int] = (),
    ):
        """`grammars`: for requests with a `json_schema` (None: they are refused). `decode`:
        how steps without prompts run (`static_decode.DecodeMode`); `graph_batch_sizes`: the
        row buckets of a static step (empty: `static_decode.default_batch_buckets`)."""
        self.model = model.eval().requires_grad_(False)
        parameter = next(model.parameters())
        self.device = parameter.device
        cfg = model.config
        self.max_batch_size = max_batch_size
        static = decode != "eager"
        self.cache = SlotKVCache(
            cfg.num_layers,
            max_batch_size + static,  # a static step's padding rows write into one more
            max_model_len,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=parameter.dtype,
            device=self.device,
        )
        self._static: StaticDecoder | None = None
        if static:
            self._static = StaticDecoder(
                self.model, self.cache, capture=decode == "graphs", batch_buckets=graph_batch_sizes
            )
        # A static step's bucket: one past the highest slot and the furthest position of the
        # next step's inputs, known in Python so that choosing it reads nothing back.
        self._extent = (0, 0)
        self.tensors = broadcast_tensors(self.model)
        self.version = 0
        self.paused = False
        self._scheduler: SlotScheduler[_Request] = SlotScheduler(max_batch_size, max_waiting)
        self._requests: dict[int, _Request] = {}
        self._running: list[_Sample] = []
        self._sampler: BatchSampler | None = None
        # While the batch stays the same, the next decode step's inputs are the tokens just
        # sampled, the same slots and the positions one further: kept as tensors, so a steady
        # step builds nothing from Python lists.
        self._next_tokens: torch.Tensor | None = None
        self._next_inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed if seed is not None else random.SystemRandom().getrandbits(63))
        self._grammars = grammars
        self._scores: list[Score] = []
        self._events: list[tuple] = []
        self._stats = CoreStats()
        self._running_requests = 0
        self._gauges = (-1, -1)

    # -- commands ------------------------------------------------------------------------------

    def handle(self, command) -> None:
        if isinstance(command, Submit):
            self._submit(command)
        elif isinstance(command, Cancel):
            request = self._requests.get(command.rid)
            if request is not None:
                self._cancel(request)
        elif isinstance(command, Score):
            self._scores.append(command)
        elif isinstance(command, ApplyWeights):
            try:
                seconds = self.apply_weights(command.tensors, command.version)
            except RequestError as error:
                self._events.append((FAILED, command.rid, error))
            else:
                self._events.append((DONE, command.rid, seconds))
        elif isinstance(command, SetPaused):
            self.paused = command.paused
            self._events.append((DONE, command.rid, command.paused))
        else:
            raise TypeError(f"unknown engine command {command!r}")

    def _submit(self, command: Submit) -> None:
        params = GenerationParams.of(command.params)
        request = _Request(
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
                request.knobs = prepare_knobs(params, EngineResources(self._grammars))
            self._scheduler.enqueue(request, params.n)
        except (QueueFullError, RequestError) as error:
            self._events.append((FAILED, command.rid, error))
            return
        self._requests[command.rid] = request

    def apply_weights(self, tensors: Mapping[str, torch.Tensor] | WeightSource, version: int) -> float:
        """Copies an update (checked by `CoreClient.update_weights`, its version by the
        servicer) into the parameters. A `WeightSource` that cannot be opened raises
        RequestError before any parameter is written."""
        started = time.perf_counter()
        update = tensors if isinstance(tensors, Mapping) else tensors.open()
        with torch.no_grad():
            names = list(update)
            # In place: the CUDA graphs of static decode steps read the parameters' storage.
            torch._foreach_copy_([self.tensors[n] for n in names], [update[n] for n in names])
        if not isinstance(tensors, Mapping):
            tensors.copied()
        if self._static is not None:
            self._static.check_weights()
        self.version = version
        return time.perf_counter() - started

    # -- steps ---------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self._scores) or (
            not self.paused and bool(self._running or self._scheduler.waiting_samples)
        )

    def step(self) -> None:
        """One score batch and one decode step, as far as there is work for them."""
        if self._scores:
            self._score_batch()
        if not self.paused and (self._running or self._scheduler.waiting_samples):
            try:
                self._decode()
            except Exception as error:  # a bug, not bad input: fail loudly to every caller
                log.exception("decode step failed; failing every running and waiting request")
                self.fail_all(error)

    def has_events(self) -> bool:
        return bool(self._events)

    def take_output(self) -> CoreOutput | None:
        """The events and statistics since the last call; None when nothing happened."""
        stats = self._stats
        gauges = (self._running_requests, self._scheduler.waiting_requests)
        if not self._events and not stats.steps and gauges == self._gauges:
            return None
        self._gauges = gauges
        stats.running_requests, stats.waiting_requests = gauges
        output = CoreOutput(self._events, stats)
        self._events, self._stats = [], CoreStats()
        return output

    def _batch_changed(self, joined: Sequence[_Sample] = ()) -> None:
        self._rows_changed(joined)
        self._next_inputs = None

    def _rows_changed(self, joined: Sequence[_Sample] = ()) -> None:
        """Rows left or `joined` the batch: the sampler goes unless it samples any rows alike
        and those that joined have its settings."""
        alike = None if self._sampler is None else self._sampler.rows_alike
        if alike is None or any(sample.settings != alike for sample in joined):
            self._sampler = None

    def _decode(self) -> None:
        admissions = self._scheduler.admit()
        if admissions or (self._next_inputs is None and self._static is None):
            self._mixed_step(admissions)
        else:
            if self._next_inputs is None:  # rows left the batch outside a step (cancelled)
                self._set_next_inputs()
            self._steady_step()

    def _mixed_step(self, admissions: list[Admission[_Request]]) -> None:
        """A step whose inputs are built from the samples: prompts join the batch, or it
        changed in a way the tensors of the last step do not describe (a cancellation)."""
        decoding = self._running
        ids = [s.tokens[-1] for s in decoding]
        positions = [s.next_position() for s in decoding]
        slots = [s.slot for s in decoding]
        keep = list(range(len(decoding)))
        prompt_lengths = []
        new_samples: list[_Sample] = []
        for admission in admissions:
            request = admission.key
            length = len(request.prompt)
            prompt_lengths.append(length)
            ids += request.prompt
            positions += range(length)
            slots += [admission.slots[0]] * length
            keep += [len(ids) - 1] * len(admission.slots)
            new_samples += self._new_samples(admission)
        if admissions:
            # In the batch before the forward, so a failing step still frees their slots.
            self._running = decoding + new_samples
            self._batch_changed(new_samples)
            self._stats.prompt_tokens += sum(len(a.key.prompt) * len(a.slots) for a in admissions)
        position_ids = torch.tensor(positions, device=self.device)
        step = self.cache.step(torch.tensor(slots, device=self.device), position_ids, prompt_lengths)
        hidden = self.model.hidden_states(torch.tensor(ids, device=self.device), position_ids, step)
        if admissions:
            hidden = hidden.index_select(0, torch.tensor(keep, device=self.device))
            self._fan_out_prefixes(admissions)
        tokens, logprobs, top = self._sample(self.model.lm_head(hidden))
        self._record(*self._to_host(tokens, logprobs), top)
        self._set_next_inputs()

    def _set_next_inputs(self) -> None:
        """The next step's inputs, from the running samples."""
        running = self._running
        self._next_inputs = None
        if running:
            self._next_tokens = torch.tensor([s.tokens[-1] for s in running], device=self.device)
            slots = [s.slot for s in running]
            positions = [s.next_position() for s in running]
            self._next_inputs = (
                torch.tensor(slots, device=self.device),
                torch.tensor(positions, device=self.device),
            )
            self._extent = (max(slots) + 1, max(positions) + 1)

    def _steady_step(self) -> None:
        """A step over the sequences of the last one: every input is already a tensor. Rows
        that finish are dropped from the next step's tensors, so it stays on this path."""
        slot_ids, position_ids = self._next_inputs
        if self._static is None:
            step = self.cache.step(slot_ids, position_ids)
            hidden = self.model.hidden_states(self._next_tokens, position_ids, step)
        else:
            shape = self._static.shape(*self._extent)
            hidden = self._static.hidden_states(self._next_tokens, slot_ids, position_ids, shape)
        tokens, logprobs, top = self._sample(self.model.lm_head(hidden))
        kept = self._record(*self._to_host(tokens, logprobs), top)
        used, span = self._extent
        if kept is not None:
            if not kept:
                self._next_inputs = None
                return
            index = torch.tensor(kept, device=self.device)
            tokens, slot_ids, position_ids = tokens[index], slot_ids[index], position_ids[index]
            running = self._running
            used, span = max(s.slot for s in running) + 1, max(s.next_position() for s in running)
        self._next_tokens = tokens
        self._next_inputs = (slot_ids, position_ids + 1)
        self._extent = (used, span + 1)

    def _to_host(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], list[float]]:
        """The sampled tokens and their logprobs as lists. On an accelerator in one copy, the
        step's only wait for the device (token ids are exact in float64, up to 2**53)."""
        if self.device.type == "cpu":
            return tokens.tolist(), logprobs.tolist()
        ids, values = torch.stack((tokens.double(), logprobs.double())).tolist()
        return [int(t) for t in ids], values

    def _sample(self, logits: torch.Tensor) -> Sampled:
        if self._sampler is None:
            running = self._running
            self._sampler = BatchSampler(
                [s.settings for s in running],
                self.device,
                lambda row: (running[row].request.prompt, running[row].tokens),
            )
        return self._sampler.sample(logits, self._generator)

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
                _Sample(
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

    def _fan_out_prefixes(self, admissions: list[Admission[_Request]]) -> None:
        """Siblings admitted together were prefilled once, in their first slot."""
        for admission in admissions:
            if len(admission.slots) == 1:
                continue
            length = len(admission.key.prompt)
            source = admission.slots[0]
            targets = torch.tensor(admission.slots[1:], device=self.device)
            for store in (*self.cache.k, *self.cache.v):
                store[targets, :length] = store[source, :length]

    def _record(
        self, tokens: list[int], logprobs: list[float], top: tuple[torch.Tensor, torch.Tensor] | None
    ) -> list[int] | None:
        """Appends each running sample's token; returns the rows still running when some
        finished (None: all carry on)."""
        if top is not None:
            self._record_top(*top)
        now = time.perf_counter()
        version = self.version
        stats = self._stats
        finished: list[tuple[_Sample, FinishReason]] = []
        deltas: dict[int, list[StreamDelta]] | None = None
        for sample, token, logprob in zip(self._running, tokens, logprobs, strict=True):
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
            self._events.extend((DELTAS, rid, items) for rid, items in deltas.items())
        if not finished:
            return None
        done = {id(s) for s, _ in finished}
        kept = [row for row, s in enumerate(self._running) if id(s) not in done]
        self._running = [self._running[row] for row in kept]
        self._rows_changed()
        for sample, reason in finished:
            self._finish(sample, reason, version, now)
        return kept

    def _record_top(self, values: torch.Tensor, token_ids: torch.Tensor) -> None:
        """The most likely tokens of this step, for the rows that asked (each its own count)."""
        values, token_ids = values.tolist(), token_ids.tolist()
        for row, sample in enumerate(self._running):
            if sample.top is not None:
                sample.top.append(_top_entries(values[row], token_ids[row], sample.settings.top_logprobs))

    def _finish(self, sample: _Sample, reason: FinishReason, version: int, now: float) -> None:
        self._scheduler.release(sample.slot)
        request = sample.request
        request.completions[sample.index] = Completion(
            sample.tokens, sample.logprobs, reason, sample.version_start, version, sample.top
        )
        self._stats.finished[reason] += 1
        if len(sample.tokens) > 1:
            self._stats.inter_token_latency.append((now - sample.first_token_at) / (len(sample.tokens) - 1))
        request.running_samples -= 1
        if request.running_samples == 0:
            self._running_requests -= 1
        request.unfinished -= 1
        if request.unfinished == 0:
            del self._requests[request.rid]
            self._stats.request_latency.append(now - request.arrival)
            if request.streaming:
                self._events.append((END, request.rid))
            else:
                self._events.append((DONE, request.rid, request.completions))

    def _cancel(self, request: _Request) -> None:
        log.debug("request %d cancelled", request.rid)
        del self._requests[request.rid]
        self._scheduler.drop(request)
        kept = []
        for sample in self._running:
            if sample.request is request:
                self._scheduler.release(sample.slot)
                self._stats.finished["abort"] += 1
            else:
                kept.append(sample)
        if len(kept) != len(self._running):
            self._running = kept
            self._batch_changed()
            self._running_requests -= 1
        request.running_samples = 0

    def _take_open_requests(self) -> list[_Request]:
        """Empties the batch and the queue; returns every request still open, in arrival order."""
        self._scheduler.drain()
        for sample in self._running:
            self._scheduler.release(sample.slot)
        self._running = []
        self._batch_changed()
        self._running_requests = 0
        requests = sorted(self._requests.values(), key=lambda r: r.arrival)
        self._requests = {}
        return requests

    def fail_all(self, error: Exception) -> None:
        for request in self._take_open_requests():
            self._events.append((FAILED, request.rid, error))
        for job in self._scores:
            self._events.append((FAILED, job.rid, error))
        self._scores = []

    def abort_all(self) -> None:
        """On stop: every open request ends with what it has, finish_reason abort."""
        partial_samples: dict[int, list[_Sample]] = {}
        for sample in self._running:
            partial_samples.setdefault(sample.request.rid, []).append(sample)
        version = self.version
        for request in self._take_open_requests():
            for sample in partial_samples.get(request.rid, []):
                request.completions[sample.index] = Completion(
                    sample.tokens, sample.logprobs, "abort", sample.version_start, version, sample.top
                )
            top = [] if request.params.top_logprobs else None
            for index, completion in enumerate(request.completions):
                if completion is None:
                    request.completions[index] = Completion([], [], "abort", version, version, top)
            if request.streaming:
                self._events.append((END, request.rid))
            else:
                self._events.append((DONE, request.rid, request.completions))
        self.fail_all(RuntimeError("the engine stopped"))

    def _score_batch(self) -> None:
        jobs, self._scores = self._scores[: self.max_batch_size], self._scores[self.max_batch_size :]
        try:
            lengths = [len(job.token_ids) for job in jobs]
            offsets = list(accumulate(lengths, initial=0))
            ids = torch.tensor([t for job in jobs for t in job.token_ids], device=self.device)
            positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])
            attend = PackedCausal(lengths)
            # Row r predicts token r + 1; job i scores its tokens start .. len - 1.
            rows = [
                r
                for job, base in zip(jobs, offsets, strict=False)
                for r in range(base + job.start - 1, base + len(job.token_ids) - 1)
            ]
            temperatures = [
                job.temperature or 1.0 for job in jobs for _ in range(job.start, len(job.token_ids))
            ]
            hidden = self.model.hidden_states(ids, positions, attend)
            row_index = torch.tensor(rows, device=self.device)
            logits = self.model.lm_head(hidden.index_select(0, row_index)).float()
            logits = logits / torch.tensor(temperatures, device=self.device)[:, None]
            distributions = torch.log_softmax(logits, dim=-1)
            logprobs = distributions.gather(1, ids[row_index + 1][:, None])[:, 0].tolist()
            most = max(job.top_logprobs for job in jobs)
            if most:
                top_values, top_ids = (t.tolist() for t in distributions.topk(min(most, logits.shape[-1])))
        except Exception as error:
            log.exception("score batch failed")
            self._events.extend((FAILED, job.rid, error) for job in jobs)
            return
        cursor = 0
        for job in jobs:
            count = len(job.token_ids) - job.start
            rows = range(cursor, cursor + count)
            top = None
            if job.top_logprobs:
                top = [_top_entries(top_values[r], top_ids[r], job.top_logprobs) for r in rows]
            result = ScoreResult(logprobs[cursor : cursor + count], self.version, top)
            self._events.append((DONE, job.rid, result))
            cursor += count


def _top_entries(values: list[float], token_ids: list[int], count: int) -> TopLogprobs:
    """One position's `count` most likely tokens, from the batch's top-k (k >= count)."""
    return list(zip(token_ids[:count], values[:count], strict=True))


class ChannelClosed(Exception):
    """The other side of a channel is gone (the front end of an engine process exited)."""


def run(core: TorchEngineCore, channel: CoreChannel) -> None:
    """Drives `core` until a `Stop` command: the commands that arrived, one step, its output.

    A crash of the core itself fails every open request before the exception propagates,
    so nothing waits forever on a dead engine."""
    try:
        with torch.inference_mode():
            _serve(core, channel)
    except ChannelClosed:
        raise  # nobody is left to tell
    except BaseException as error:
        log.exception("the engine crashed; failing every open request")
        core.fail_all(error if isinstance(error, Exception) else RuntimeError("the engine crashed"))
        _flush(core, channel)
        raise
    _flush(core, channel)


def _serve(core: TorchEngineCore, channel: CoreChannel) -> None:
    flushed_at = 0.0
    worked = False
    while True:
        idle = not core.has_work()
        if idle:
            _flush(core, channel)
            if worked:
                release_memory()  # a burst is over: its batches' memory goes back
            worked = False
        else:
            worked = True
        for command in channel.receive(wait=idle):
            if isinstance(command, Stop):
                core.abort_all()
                return
            core.handle(command)
        core.step()
        # Answers go out at once; statistics alone wait a little, since every output costs
        # the decode loop a send and wakes the other side.
        now = time.perf_counter()
        if core.has_events() or now - flushed_at >= STATS_INTERVAL_S:
            _flush(core, channel)
            flushed_at = now


def _flush(core: TorchEngineCore, channel: CoreChannel) -> None:
    output = core.take_output()
    if output is not None:
        channel.send(output)
