"""The trace files of `rlrun dashboard`'s trace viewer (`orchestrator.traces`):
`<run_dir>/traces/<phase>_step_<N>.jsonl`, a few groups of step N of the phase (`warmup` or
`rl`), written once the step trained, with everything the viewer shows of each token.

One JSON object per line, one line per group:
- `phase`, `step` (the step's number in its phase), `trainer_step`, `policy_version` (the
  version the batch trained at; a trace's `policySpan` says which versions sampled it),
- `group_id`, `env`, `task` (`{env, split, idx}`; each trace's own `task` has its data),
- `dropped`: null for a group of the batch; for a group dropped since the step before,
  `{"reason": "stale" | the failure's label (as groups_failed_total labels it), "detail"}`,
- `traces`: each trace as the rollout dumps write it (outputs.trace_row: nodes with their
  token ids, sampled masks and logprobs, branches with their trained mask and loss channels,
  rewards and their parts, policySpan, errors, and for a group of the batch `isFiltered` and
  `filters`); a dropped group's traces where it finished, none otherwise,
- `tokens`: `{"<id>": text}` for every token id of the group's traces, as the live policy's
  tokenizer decodes the id alone, special tokens included. An id missing from it could not be
  decoded (the replica did not answer): the viewer shows the id.

A file holds at most `groups_per_step` groups of the batch, spread evenly over it, and the last
`dropped_per_step` groups dropped; a step trained again after a resume writes its file anew.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from rlrun.common.config.orchestrator import TracesConfig
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.wire.inference import (
    DetokenizeRequest,
    detokenize_request_to_proto,
    detokenize_response_from_proto,
)
from rlrun.common.wire.trace import TaskRef, Trace
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.collect.scheduler import DroppedGroup
from rlrun.orchestrator.run.outputs import RunOutputs, trace_row
from rlrun.orchestrator.run.step import StepRecord
from rlrun.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

DETOKENIZE_BATCH = 256
"""Detokenize calls in flight at once when a step brings many new token ids."""
DETOKENIZE_TIMEOUT_S = 10.0


class TokenTexts:
    """The text of each token id, as the live policy's first replica decodes it alone; cached
    for the run (a vocabulary does not change). Failures leave ids undecoded, never fail the run."""

    def __init__(self, addresses: list[str], options: ClientOptions):
        self.addresses = addresses
        self.options = options
        self._channel: grpc.aio.Channel | None = None
        self._texts: dict[int, str] = {}
        self._warned = False

    async def texts(self, ids: set[int]) -> dict[int, str]:
        missing = sorted(ids - self._texts.keys())
        if missing:
            if self._channel is None:
                self._channel = open_channel(self.addresses[0], self.options)
            stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
            try:
                for start in range(0, len(missing), DETOKENIZE_BATCH):
                    chunk = missing[start : start + DETOKENIZE_BATCH]
                    replies = await asyncio.gather(
                        *(
                            stub.Detokenize(
                                detokenize_request_to_proto(
                                    DetokenizeRequest([i], skip_special_tokens=False)
                                ),
                                timeout=DETOKENIZE_TIMEOUT_S,
                            )
                            for i in chunk
                        )
                    )
                    self._texts.update(zip(chunk, map(detokenize_response_from_proto, replies), strict=True))
            except grpc.aio.AioRpcError as error:
                if not self._warned:
                    log.warning(
                        "trace files: Detokenize on %s failed (%s: %s); tokens are shown as ids until it answers",
                        self.addresses[0],
                        error.code().name,
                        error.details(),
                    )
                    self._warned = True
        return {i: self._texts[i] for i in ids if i in self._texts}

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


def spread(count: int, total: int) -> list[int]:
    """`count` indices of `range(total)`, evenly spaced from the first."""
    count = min(count, total)
    return [i * total // count for i in range(count)]


def _token_ids(traces: list[Trace]) -> set[int]:
    return {tok for trace in traces for node in trace.nodes for tok in node.token_ids}


class TraceWriter:
    def __init__(self, config: TracesConfig, outputs: RunOutputs, texts: TokenTexts):
        self.config = config
        self.outputs = outputs
        self.token_texts = texts

    def due(self, number: int) -> bool:
        cfg = self.config
        return (cfg.groups_per_step > 0 or cfg.dropped_per_step > 0) and number % cfg.interval == 0

    async def write(self, phase: str, record: StepRecord, drops: list[DroppedGroup]) -> None:
        """The trace file of a trained step (when one is due)."""
        if not self.due(record.number):
            return
        batch, line = record.batch, record.line
        head: dict[str, Any] = {
            "phase": phase,
            "step": record.number,
            "trainer_step": line["trainer_step"],
            "policy_version": line["policy_version"],
        }
        kept: list[tuple[dict[str, Any], list[Trace], list[dict[str, Any]]]] = []
        for index in spread(self.config.groups_per_step, len(batch.groups)):
            group: RolloutGroup = batch.groups[index]
            rows = [trace_row(t, batch.flags.get(t.id, []), t.id in batch.filtered) for t in group.traces]
            kept.append((self._group(group.group_id, group.env, group.task, None), group.traces, rows))
        for drop in drops[-self.config.dropped_per_step :] if self.config.dropped_per_step else []:
            dropped = {"reason": drop.reason, "detail": drop.detail}
            rows = [trace_row(t) for t in drop.traces]
            kept.append((self._group(drop.group_id, drop.env, drop.task, dropped), drop.traces, rows))
        out = []
        for group_head, traces, rows in kept:
            texts = await self.token_texts.texts(_token_ids(traces))
            out.append(
                {**head, **group_head, "traces": rows, "tokens": {str(k): v for k, v in texts.items()}}
            )
        self.outputs.write_traces(phase, record.number, out)

    @staticmethod
    def _group(group_id: str, env: str, task: TaskRef, dropped: dict[str, str] | None) -> dict[str, Any]:
        return {
            "group_id": group_id,
            "env": env,
            "task": {"env": task.env, "split": task.split, "idx": task.idx},
            "dropped": dropped,
        }
