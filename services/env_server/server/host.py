"""One env entry served by this env-server: its environment (for GetInfo and request
validation), its worker pool, its rollout log, and the bookkeeping Cancel needs."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from rlrun.common.config import EnvConfig, RunConfig
from rlrun.common.errors import RequestError
from rlrun.common.grpc_client import ClientOptions
from rlrun.common.tokenizer_info import load_with_info
from rlrun.common.wire.env import BranchResult, EncodedTraces, EnvInfo, TraceSummary, encode_traces
from rlrun.common.wire.plan import GenerationPlan
from rlrun.common.wire.trace import TaskRef, Trace, TraceError
from rlrun.env_server.envs.registry import make_env
from rlrun.env_server.sdk.algorithms import AlgorithmContext, run_env_algorithms
from rlrun.env_server.sdk.task import Task
from rlrun.env_server.server.logs import RolloutLog
from rlrun.env_server.server.metrics import CANCELLED as CANCELLED_ROLLOUTS
from rlrun.env_server.server.metrics import (
    FAILED_ROLLOUTS,
    IN_FLIGHT,
    REQUEST_SECONDS,
    ROLLOUT_ERRORS,
    ROLLOUTS,
    init_env,
)
from rlrun.env_server.server.model_scorer import ModelScorer
from rlrun.env_server.server.pool import JobCancelled, WorkerLost, WorkerPool
from rlrun.env_server.server.rollout import CANCELLED, RolloutJob, error_traces
from rlrun.env_server.server.worker import WorkerSpec

REMEMBERED_CANCELS = 4096
"""Cancelled ids kept, so that a request arriving after its Cancel is cancelled at once."""


class _RecentIds:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, ids) -> None:
        for i in ids:
            if i:
                self._ids[i] = None
                self._ids.move_to_end(i)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def __contains__(self, i: str) -> bool:
        return i in self._ids


class EnvHost:
    def __init__(self, entry: EnvConfig, config: RunConfig, log_dir: Path, client_options: ClientOptions):
        self.key = entry.key
        init_env(self.key)
        harness = entry.harness.model_dump() if entry.harness else None
        runtime = entry.runtime.model_dump() if entry.runtime else None
        self.env = make_env(entry.id, entry.args, harness, runtime)
        self.temperature = entry.sampling.apply(config.orchestrator.train.sampling).temperature
        tokenizer, self.tokenizer = load_with_info(config.model.tokenizer, config.model.path)
        self.vocab_size = tokenizer.vocab_size
        self.pool = WorkerPool(
            WorkerSpec(
                env_key=self.key,
                env_id=entry.id,
                env_args=dict(entry.args),
                harness=harness,
                runtime=runtime,
                tokenizer_path=config.model.tokenizer,
                checkpoint_dir=config.model.path,
                max_model_len=config.model.max_model_len,
                client_options=client_options,
                unavailable_retry_s=config.grpc.unavailable_retry_s,
                log_dir=log_dir,
                log_level=config.log_level,
            ),
            entry.pool,
            # A worker that dies leaves its sandboxes' folders; the pool removes them.
            reap=self.env.runtime.reap if self.env.runtime is not None else None,
        )
        self.rollout_log = RolloutLog(log_dir, self.key)
        self.scorer = ModelScorer(client_options)
        """Score on the model endpoints RunAlgorithms names (env-owned algorithms run here)."""
        self._jobs: dict[int, tuple[RolloutJob, asyncio.Event]] = {}
        self._job_ids = itertools.count()
        self._cancelled = _RecentIds(REMEMBERED_CANCELS)

    async def start(self) -> None:
        await self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()
        await self.scorer.close()
        self.rollout_log.close()

    # -- GetInfo and validation ---------------------------------------------------------------

    def info(self) -> EnvInfo:
        return EnvInfo(
            env_id=self.key,
            task_counts=self.env.taskset.sizes,
            group_scoring=self.env.group_scoring,
            algorithms=sorted(self.env.algorithms()),
            members=list(self.env.members),
            temperature=self.temperature,
            # The workers render ids with this tokenizer: the orchestrator refuses a model serving another.
            tokenizer=self.tokenizer,
        )

    def task(self, ref: TaskRef, where: str = "task") -> Task:
        sizes = self.env.taskset.sizes
        if ref.split not in sizes:
            raise RequestError(
                f"{where}.split",
                f"env {self.key!r} has no split {ref.split!r}; its splits are {sorted(sizes)}",
            )
        if not 0 <= ref.idx < sizes[ref.split]:
            raise RequestError(
                f"{where}.idx",
                f"{ref.idx} is out of range: env {self.key!r} has {sizes[ref.split]} {ref.split} tasks",
            )
        return self.env.taskset.get(ref.split, ref.idx)

    def check_plan(self, plan: GenerationPlan, where: str = "plan") -> None:
        """A single-agent env needs one target; a multi-agent env one target per member. A rule
        target needs the env's reference answer (single-agent) or rules (multi-agent)."""
        members = self.env.members
        if not members and len(plan.targets) != 1:
            raise RequestError(
                f"{where}.targets",
                f"env {self.key!r} is single-agent and needs exactly one target, got {sorted(plan.targets)}",
            )
        if members and sorted(plan.targets) != sorted(members):
            raise RequestError(
                f"{where}.targets",
                f"env {self.key!r} is multi-agent and needs one target per member {sorted(members)}, "
                f"got {sorted(plan.targets)}",
            )
        plays_rules = self.env.has_rule_reply if members else self.env.has_reference_answer
        for i, (key, target) in enumerate(plan.targets.items()):
            at = f"{where}.targets[{i}]"
            if target.model.kind == "rule" and not plays_rules:
                what = "rules for its members" if members else "reference answer"
                raise RequestError(
                    f"{at}.model.kind",
                    f"env {self.key!r} has no {what}, so it cannot play the rule target {key!r}",
                )

    # -- rollouts -----------------------------------------------------------------------------

    async def run(self, job: RolloutJob, timeout_s: float) -> EncodedTraces:
        """Runs the job on the pool; every outcome but a server bug is traces."""
        job_id = next(self._job_ids)
        cancelled = asyncio.Event()
        if job.group_id in self._cancelled or any(rid in self._cancelled for rid in job.rollout_ids):
            cancelled.set()
        self._jobs[job_id] = (job, cancelled)
        IN_FLIGHT.labels(self.key).inc(len(job.rollout_ids))
        try:
            encoded = EncodedTraces(await self.pool.run(job_id, job, timeout_s, cancelled))
        except JobCancelled:
            encoded = self._synthesized(
                error_traces(job, CANCELLED, stop="cancelled", members=self.env.members)
            )
        except WorkerLost as error:
            encoded = self._synthesized(
                error_traces(job, TraceError("WorkerLost", str(error), True), members=self.env.members)
            )
        finally:
            del self._jobs[job_id]
            IN_FLIGHT.labels(self.key).dec(len(job.rollout_ids))
        self._record(job, encoded.summaries())
        return encoded

    @staticmethod
    def _synthesized(traces: list[Trace]) -> EncodedTraces:
        for trace in traces:
            trace.validate()
        return encode_traces(traces)

    def _record(self, job: RolloutJob, traces: list[TraceSummary]) -> None:
        """One log line and one update per metric series for the whole request: per-rollout
        logging and labelling would cost more than the rest of the server's own work."""
        if not traces:
            return
        self.rollout_log.record(job.task.split, job.task.idx, job.group_id, traces)
        split = job.task.split
        rollouts = {
            t.rollout_id: t for t in traces
        }.values()  # a multi-agent rollout has one trace per member
        stops = Counter(t.stop_condition for t in rollouts)
        for stop, count in stops.items():
            ROLLOUTS.labels(self.key, split, stop or "unspecified").inc(count)
        for (kind, retryable), count in Counter(
            (e.type, e.retryable) for t in rollouts for e in t.errors
        ).items():
            ROLLOUT_ERRORS.labels(self.key, kind, str(retryable).lower()).inc(count)
        FAILED_ROLLOUTS.labels(self.key).inc(
            sum(any(e.type != CANCELLED.type for e in t.errors) for t in rollouts)
        )
        REQUEST_SECONDS.labels(self.key).observe(max(t.total_s for t in traces))

    def cancel(self, group_ids: set[str], rollout_ids: set[str]) -> int:
        """Cancels every job of these groups or holding one of these rollouts (a group's job
        is cancelled whole); returns the number of rollouts cancelled."""
        self._cancelled.add(group_ids | rollout_ids)
        count = 0
        for job, cancelled in self._jobs.values():
            if cancelled.is_set():
                continue
            if job.group_id in group_ids or any(rid in rollout_ids for rid in job.rollout_ids):
                cancelled.set()
                count += len(job.rollout_ids)
        CANCELLED_ROLLOUTS.labels(self.key).inc(count)
        return count

    # -- env-owned algorithms ------------------------------------------------------------------

    def check_algorithms(self, ids: list[str], where: str = "algorithms") -> None:
        available = self.env.algorithms()
        for i, algorithm_id in enumerate(ids):
            if algorithm_id not in available:
                raise RequestError(
                    f"{where}[{i}]",
                    f"env {self.key!r} has no algorithm {algorithm_id!r}; it has {sorted(available)}",
                )

    async def run_algorithms(
        self,
        ids: list[str],
        traces: list[Trace],
        args: dict[str, dict[str, Any]] | None = None,
        models: dict[str, list[str]] | None = None,
    ) -> list[BranchResult]:
        """Runs `ids` over one group's traces, each with its settings (`args[id]`) and the
        run's model endpoints (`models`: key -> replicas)."""
        contexts = {
            algorithm_id: AlgorithmContext(
                dict((args or {}).get(algorithm_id, {})), dict(models or {}), self.scorer
            )
            for algorithm_id in ids
        }
        return await run_env_algorithms(self.env.algorithms(), ids, traces, contexts)
