"""The torch engine's core: continuous batching over a slot KV cache, synchronous and
single-threaded, driven through its command protocol (`core_protocol`: commands in through
`handle`, events and statistics out of `take_output`), keeping its requests in `core_requests`
and scoring in `core_scoring`.

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
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlrun.common.config import RunConfig
from rlrun.common.errors import RequestError
from rlrun.common.model import CausalLM, SlotKVCache, build_model
from rlrun.common.weights.protocol import WeightSource, broadcast_tensors
from rlrun.inference.engines.core_protocol import (
    DONE,
    FAILED,
    ApplyWeights,
    Cancel,
    CoreOutput,
    Score,
    SetPaused,
    Submit,
)
from rlrun.inference.engines.core_requests import Request, RequestBook, Sample
from rlrun.inference.engines.core_scoring import score_batch
from rlrun.inference.engines.scheduler import Admission
from rlrun.inference.engines.static_decode import DecodeMode, StaticDecoder, decode_mode
from rlrun.inference.sampler import BatchSampler, Sampled
from rlrun.inference.structured import GrammarCompiler, model_grammars

log = logging.getLogger(__name__)


def core_settings(config: RunConfig) -> dict[str, Any]:
    """TorchEngineCore's settings from `[model]` and `[inference]`."""
    return {
        "max_model_len": config.model.max_model_len,
        "max_batch_size": config.inference.max_batch_size,
        "max_waiting": config.inference.max_waiting,
        "grammars": model_grammars(config),
        "decode": decode_mode(config.inference.cuda_graphs, config.inference.device),
        "graph_batch_sizes": config.inference.cuda_graph_batch_sizes,
    }


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
        self.book = RequestBook(max_batch_size, max_waiting)
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

    @classmethod
    def from_config(cls, config: RunConfig) -> TorchEngineCore:
        """The core `rlrun serve inference` runs: the model of `[model]` on `inference.device`."""
        return cls(
            build_model(config.model, device=config.inference.device, lora=config.trainer.lora),
            **core_settings(config),
        )

    # -- commands ------------------------------------------------------------------------------

    def handle(self, command) -> None:
        if isinstance(command, Submit):
            self.book.submit(command, self._grammars)
        elif isinstance(command, Cancel):
            request = self.book.requests.get(command.rid)
            if request is not None and self.book.cancel(request):
                self._batch_changed()
        elif isinstance(command, Score):
            self._scores.append(command)
        elif isinstance(command, ApplyWeights):
            try:
                seconds = self.apply_weights(command.tensors, command.version)
            except RequestError as error:
                self.book.events.append((FAILED, command.rid, error))
            else:
                self.book.events.append((DONE, command.rid, seconds))
        elif isinstance(command, SetPaused):
            self.paused = command.paused
            self.book.events.append((DONE, command.rid, command.paused))
        else:
            raise TypeError(f"unknown engine command {command!r}")

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
            not self.paused and bool(self.book.running or self.book.scheduler.waiting_samples)
        )

    def step(self) -> None:
        """One score batch and one decode step, as far as there is work for them."""
        if self._scores:
            self._score_batch()
        if not self.paused and (self.book.running or self.book.scheduler.waiting_samples):
            try:
                self._decode()
            except Exception as error:  # a bug, not bad input: fail loudly to every caller
                log.exception("decode step failed; failing every running and waiting request")
                self.fail_all(error)

    def has_events(self) -> bool:
        return bool(self.book.events)

    def take_output(self) -> CoreOutput | None:
        """The events and statistics since the last call; None when nothing happened."""
        return self.book.take_output()

    def _batch_changed(self, joined: Sequence[Sample] = ()) -> None:
        self._rows_changed(joined)
        self._next_inputs = None

    def _rows_changed(self, joined: Sequence[Sample] = ()) -> None:
        """Rows left or `joined` the batch: the sampler goes unless it samples any rows alike
        and those that joined have its settings."""
        alike = None if self._sampler is None else self._sampler.rows_alike
        if alike is None or any(sample.settings != alike for sample in joined):
            self._sampler = None

    def _decode(self) -> None:
        admissions = self.book.scheduler.admit()
        if admissions or (self._next_inputs is None and self._static is None):
            self._mixed_step(admissions)
        else:
            if self._next_inputs is None:  # rows left the batch outside a step (cancelled)
                self._set_next_inputs()
            self._steady_step()

    def _mixed_step(self, admissions: list[Admission[Request]]) -> None:
        """A step whose inputs are built from the samples: prompts join the batch, or it
        changed in a way the tensors of the last step do not describe (a cancellation)."""
        decoding = self.book.running
        ids = [s.tokens[-1] for s in decoding]
        positions = [s.next_position() for s in decoding]
        slots = [s.slot for s in decoding]
        keep = list(range(len(decoding)))
        prompt_lengths = []
        new_samples: list[Sample] = []
        for admission in admissions:
            request = admission.key
            length = len(request.prompt)
            prompt_lengths.append(length)
            ids += request.prompt
            positions += range(length)
            slots += [admission.slots[0]] * length
            keep += [len(ids) - 1] * len(admission.slots)
            new_samples += self.book.new_samples(admission, self.device)
        if admissions:
            # In the batch before the forward, so a failing step still frees their slots.
            self.book.running = decoding + new_samples
            self._batch_changed(new_samples)
            self.book.stats.prompt_tokens += sum(len(a.key.prompt) * len(a.slots) for a in admissions)
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
        running = self.book.running
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
            running = self.book.running
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
            running = self.book.running
            self._sampler = BatchSampler(
                [s.settings for s in running],
                self.device,
                lambda row: (running[row].request.prompt, running[row].tokens),
            )
        return self._sampler.sample(logits, self._generator)

    def _fan_out_prefixes(self, admissions: list[Admission[Request]]) -> None:
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
        """The step's tokens into the books; the rows still running when some finished (None:
        all carry on)."""
        kept = self.book.record(tokens, logprobs, top, self.version)
        if kept is not None:
            self._rows_changed()
        return kept

    def fail_all(self, error: Exception) -> None:
        for request in self.book.take_open_requests():
            self.book.events.append((FAILED, request.rid, error))
        self._batch_changed()
        for job in self._scores:
            self.book.events.append((FAILED, job.rid, error))
        self._scores = []

    def abort_all(self) -> None:
        """On stop: every open request ends with what it has, finish_reason abort."""
        self.book.abort_open_requests(self.version)
        self._batch_changed()
        self.fail_all(RuntimeError("the engine stopped"))

    def _score_batch(self) -> None:
        jobs, self._scores = self._scores[: self.max_batch_size], self._scores[self.max_batch_size :]
        self.book.events.extend(score_batch(self.model, jobs, self.version, self.device))
