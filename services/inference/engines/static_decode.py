"""The torch engine's decode step at static shapes, replayed from CUDA graphs on CUDA.

An eager decode step costs a kernel launch per operation, some hundreds per layer set: on a
GPU the host, not the device, sets the pace (31 ms per 128-row step of a 385M model, against
6.6 ms for the same step from a CUDA graph). A graph replays a fixed sequence of kernels on
fixed buffers, so the step is written at static shapes (`StaticSlotStep`): row r of the
step is cache slot r, for the first `rows` slots, and reads `span` cached positions. Both
are bucketed, and a graph is captured per (rows, span) bucket on its first use, all in one
memory pool. Replaying means copying this step's tokens and positions into persistent
input buffers, and the graph writes the hidden states of every row into its own output.

The same code runs eagerly (`capture=False`): on CPU, where launches are cheap and the
engine keeps its dynamic-shape step by default, it is what the tests compare against the
model's plain forward pass.

Graphs hold the addresses of the parameters they read: a weight update must copy into the
same storage (`TorchEngineCore.apply_weights` does, with `_foreach_copy_`), never replace a
parameter. `check_weights` says whether that still holds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Literal

import torch

from rlrun.common.model import CausalLM, SlotKVCache
from rlrun.common.model.attention import StaticSlotStep

DecodeMode = Literal["eager", "static", "graphs"]
"""How the torch engine runs its decode steps: `eager` at the batch's own shapes (CPU's
default), `static` at bucketed shapes without capture, `graphs` at bucketed shapes replayed
from CUDA graphs (CUDA only)."""

SMALLEST_SPAN = 64
"""Spans read from the cache go 64, 96, 128, 192, 256, 384, ...: a step reads at most half
again the positions it needs, and every span is a multiple of 16, which the memory-efficient
attention kernel wants for its mask's rows."""


def decode_mode(cuda_graphs: Literal["auto", "on", "off"], device: torch.device | str) -> DecodeMode:
    """The mode `inference.cuda_graphs` asks for on `device` (auto: graphs on CUDA; the
    config refuses `on` elsewhere)."""
    return "graphs" if torch.device(device).type == "cuda" and cuda_graphs != "off" else "eager"


def default_batch_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then steps of a quarter of the power of two below (10, 12, 14, 16, 20,
    24, ...), up to and with `max_batch_size`: a bucket pads at most a fifth of its rows."""
    buckets, size = [], 1
    while size < max_batch_size:
        buckets.append(size)
        power = 1 << (size.bit_length() - 1)
        size += max(power // 4, 1) if size >= 8 else size
    return [*buckets, max_batch_size]


def span_buckets(max_len: int) -> list[int]:
    """The spans a step may read (SMALLEST_SPAN), the last `max_len` itself."""
    buckets, span = [], SMALLEST_SPAN
    while span < max_len:
        buckets.append(span)
        # Powers of two and halfway between: times 1.5 from a power of two, 4/3 after.
        span = span * 3 // 2 if span & (span - 1) == 0 else span * 4 // 3
    return [*buckets, max_len]


class StaticDecoder:
    """Decode steps over `cache`, whose last slot is the scratch slot padding rows write to
    (the engine's scheduler hands out every other one)."""

    def __init__(
        self,
        model: CausalLM,
        cache: SlotKVCache,
        *,
        capture: bool,
        batch_buckets: Sequence[int] = (),
    ):
        self.model = model
        self.cache = cache
        self.slots = cache.slots - 1
        self.scratch = self.slots
        self.batch_buckets = sorted(set(batch_buckets)) or default_batch_buckets(self.slots)
        if self.batch_buckets[0] < 1 or self.batch_buckets[-1] > self.slots:
            raise ValueError(
                f"batch_buckets must lie in 1 .. {self.slots} (the slots), got {list(batch_buckets)}"
            )
        if self.batch_buckets[-1] != self.slots:
            self.batch_buckets.append(self.slots)
        self.span_buckets = span_buckets(cache.max_len)
        self.capture = capture
        if capture and cache.k[0].device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {cache.k[0].device}")
        device = cache.k[0].device
        # Persistent inputs of every bucket (a bucket's are the first `rows` of each). Padding
        # rows write into the scratch slot.
        self.tokens = torch.zeros(self.slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(self.slots, dtype=torch.long, device=device)
        self.write_slots = torch.full((self.slots,), self.scratch, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._weights = self._weight_addresses()

    def shape(self, used_slots: int, span: int) -> tuple[int, int]:
        """The (rows, span) bucket of a step whose highest slot is `used_slots - 1` and whose
        furthest position is `span - 1`."""
        if span > self.cache.max_len:
            raise ValueError(f"a decode step reads {span} positions, the cache holds {self.cache.max_len}")
        rows = self.batch_buckets[bisect_left(self.batch_buckets, used_slots)]
        return rows, self.span_buckets[bisect_left(self.span_buckets, span)]

    def hidden_states(
        self,
        tokens: torch.Tensor,
        slot_ids: torch.Tensor,
        positions: torch.Tensor,
        shape: tuple[int, int],
    ) -> torch.Tensor:
        """The final hidden states [len(slot_ids), hidden] of one decode step: sequence i feeds
        `tokens[i]` at `positions[i]` into its slot `slot_ids[i]` (each in the bucket `shape`).
        No host synchronisation: the inputs go into the static buffers on the device."""
        # Rows that ran a sequence before keep its last token and position: any is valid,
        # once their writes go to the scratch slot.
        self.write_slots.fill_(self.scratch)
        self.tokens.index_copy_(0, slot_ids, tokens)
        self.positions.index_copy_(0, slot_ids, positions)
        self.write_slots.index_copy_(0, slot_ids, slot_ids)
        hidden = self._replay(shape) if self.capture else self._forward(*shape)
        return hidden.index_select(0, slot_ids)

    def _forward(self, rows: int, span: int) -> torch.Tensor:
        positions = self.positions[:rows]
        attend = StaticSlotStep(self.cache, self.write_slots[:rows], positions, span)
        return self.model.hidden_states(self.tokens[:rows], positions, attend)

    def _replay(self, shape: tuple[int, int]) -> torch.Tensor:
        graph = self.graphs.get(shape)
        if graph is None:
            # Capture takes the current device's streams; the engine's may be another one
            # (`cuda:1`), and the current device is per thread.
            with torch.cuda.device(self.cache.k[0].device):
                graph = self._capture(shape)
        graph.replay()
        return self._outputs[shape]

    def _capture(self, shape: tuple[int, int]) -> torch.cuda.CUDAGraph:
        # A first run on a side stream sets up what capture must not (cuBLAS workspaces,
        # kernel selection). It computes this very step: its K/V writes are the ones the
        # replay after capture makes again, with the same values.
        stream = torch.cuda.Stream(self.cache.k[0].device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(*shape)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a thread of the front end may use CUDA meanwhile (weights arriving
        # for the in-process engine), which global capture mode would make fail.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            # The output stays referenced, so graphs captured later in the shared pool
            # never reuse its memory.
            self._outputs[shape] = self._forward(*shape)
        self.graphs[shape] = graph
        return graph

    def _weight_addresses(self) -> list[int]:
        return [p.data_ptr() for p in self.model.parameters()]

    def check_weights(self) -> None:
        """Raises if a parameter no longer lives where the captured graphs read it."""
        if self._weight_addresses() != self._weights:
            raise RuntimeError(
                "a parameter of the model moved to new storage: CUDA graphs would read the old one; "
                "weight updates must copy into the parameters in place"
            )
