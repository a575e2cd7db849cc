"""In-test fakes of the services the orchestrator talks to, on 127.0.0.1: an env-server that
crafts traces (with knobs for slow, stale, failing, refused and out-of-vocabulary groups), a
trainer that checks the step sequence and stores checkpoint state, and an inference replica
(health, Score)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import grpc
import pytest

from rlrun.common.config import resolve_config
from rlrun.common.config.model import CHAR_TOKENIZER
from rlrun.common.grpc_server import GrpcServer, ServerOptions
from rlrun.common.tokenizer import CharTokenizer
from rlrun.common.tokenizer_info import tokenizer_info
from rlrun.common.wire.plan import plan_from_proto, tokenizer_info_to_proto
from rlrun.common.wire.trace import (
    Branch,
    MessageNode,
    Trace,
    TraceError,
    task_from_proto,
    trace_from_proto,
    trace_to_proto,
)
from rlrun.common.wire.training import batch_from_proto
from rlrun.v1 import (
    env_pb2,
    env_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    trace_pb2,
    trainer_pb2,
    trainer_pb2_grpc,
)

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name
TRAINER_SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name
INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
STALE_TOKEN = 99
"""Completion token of groups the fake env makes stale on purpose (it must never train)."""
REPO = Path(__file__).resolve().parents[3]
OOV_TOKEN = 128
"""A token id just outside the vocabulary of the default model (configs/models/tiny-d64.json)."""


class FakeTrainer(trainer_pb2_grpc.TrainerServiceServicer):
    """The trainer's checkpoint contract without a model: step 0 is saved at start, each
    SubmitBatch's orchestrator_state is kept and saved every `checkpoint_every` steps, a
    SaveCheckpoint for another step is refused, and Rollback goes back to the newest
    checkpoint at or before max_step, dropping the later ones."""

    def __init__(self, delay: float = 0.01, skip_steps=()):
        self.step = 0
        self.version = 0
        self.delay = delay
        self.skip_steps = set(skip_steps)
        self.resume_state = b""
        self.batches = []
        self.checkpoints: list[tuple[int, bytes]] = [(0, b"")]
        self.checkpoint_every: int | None = None
        self.step_reached = asyncio.Event()
        self.crash_at: int | None = None
        self.reject_step: int | None = None

    async def GetStatus(self, request, context):
        return trainer_pb2.GetTrainerStatusResponse(
            step=self.step, policy_version=self.version, resume_state=self.resume_state
        )

    async def SubmitBatch(self, request, context):
        batch = batch_from_proto(request.batch)
        if batch.step != self.step:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"batch.step {batch.step} != trainer step {self.step}"
            )
        if batch.step == self.reject_step:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "batch.samples[0].mask: rejected by the fake"
            )
        await asyncio.sleep(self.delay)
        self.batches.append(batch)
        if batch.step in self.skip_steps:
            self.skip_steps.discard(batch.step)
            return trainer_pb2.SubmitBatchResponse(
                step=self.step, policy_version=self.version, skipped=True, skip_reason="loss is nan"
            )
        self.step += 1
        self.version += 1
        self.resume_state = bytes(request.orchestrator_state) or self.resume_state
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.checkpoints.append((self.step, self.resume_state))
        if self.crash_at is not None and self.step >= self.crash_at:
            self.step_reached.set()
        return trainer_pb2.SubmitBatchResponse(
            step=self.step, policy_version=self.version, metrics={"loss": 0.5}
        )

    async def SaveCheckpoint(self, request, context):
        if request.HasField("step") and request.step != self.step:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"step: {request.step} != {self.step}")
        self.resume_state = bytes(request.extra_state) or self.resume_state
        self.checkpoints.append((self.step, self.resume_state))
        return trainer_pb2.SaveCheckpointResponse(path=f"checkpoints/step_{self.step}", step=self.step)

    async def Rollback(self, request, context):
        limit = request.max_step if request.max_step >= 0 else None
        kept = [c for c in self.checkpoints if limit is None or c[0] <= limit]
        step, state = max(kept, key=lambda c: c[0])  # the last saved among equal steps
        self.checkpoints = [c for c in self.checkpoints if c[0] <= step]
        self.step, self.version, self.resume_state = step, step, state
        return trainer_pb2.RollbackResponse(
            step=step, policy_version=step, checkpoint=f"checkpoints/step_{step}", resume_state=state
        )

    def restart_from_last_checkpoint(self) -> None:
        """What a restarted trainer does: back to its newest checkpoint, with its extra state."""
        self.step, self.resume_state = self.checkpoints[-1]
        self.version = self.step
        self.crash_at = None


class FakeEnv(env_pb2_grpc.EnvServiceServicer):
    """RunGroup answers n single-turn traces. The knobs select RL groups by their dispatch
    index (the counter that ends their id) and count attempts per group. Train rewards
    alternate 1/0 within a group; the eval reward is 0.1 per policy version (capped at 1); the
    dev reward jumps to 0.6 from version `dev_good_from`."""

    def __init__(
        self,
        trainer: FakeTrainer,
        env_id: str = "reverse-text",
        *,
        members=(),
        algorithms=(),
        counts=None,
        temperature: float = 1.0,
    ):
        self.trainer = trainer
        self.info = env_pb2.EnvInfo(
            env_id=env_id,
            task_counts=counts or {"train": 1000, "eval": 6},
            members=list(members),
            algorithms=list(algorithms),
            temperature=temperature,
        )
        self.calls: list[env_pb2.RunGroupRequest] = []
        self.attempts: Counter[str] = Counter()
        self.cancels: list[str] = []
        self.cancelled_in_flight: list[str] = []
        self.hang_groups: set[int] = set()
        self.stale_groups: set[int] = set()
        self.unavailable_groups: dict[int, int] = {}
        """group index -> attempts answered UNAVAILABLE (-1: all of them)."""
        self.retryable_error_groups: dict[int, int] = {}
        """group index -> attempts answered with retryable trace errors."""
        self.fatal_error_groups: set[int] = set()
        self.abort_code: grpc.StatusCode | None = None
        self.abort_groups: dict[int, grpc.StatusCode] = {}
        """group index -> the status every attempt of that group is answered with."""
        self.abort_eval_tasks: dict[int, grpc.StatusCode] = {}
        """eval task index -> the status every attempt of its group is answered with."""
        self.oov_groups: set[int] = set()
        """Groups whose first trace samples OOV_TOKEN (at nodes[1].token_ids[0])."""
        self.sampled_logprob = -0.5
        self.dev_good_from = 2
        self.algorithm_calls: list[env_pb2.RunAlgorithmsRequest] = []
        self.algorithm_value = 2.0
        self.algorithm_mask_length_error = False

    async def GetInfo(self, request, context):
        return env_pb2.GetInfoResponse(envs=[self.info])

    async def RunGroup(self, request, context):
        self.calls.append(request)
        self.attempts[request.group_id] += 1
        attempt = self.attempts[request.group_id]
        index = int(request.group_id.rsplit("-", 1)[1]) if request.group_id.startswith("rl-") else None
        if self.abort_code is not None:
            await context.abort(self.abort_code, "the fake env refuses")
        task = task_from_proto(request.task)
        code = self.abort_eval_tasks.get(task.idx) if task.split == "eval" else self.abort_groups.get(index)
        if code is not None:
            await context.abort(code, f"the fake env fails group {request.group_id}")
        if index in self.unavailable_groups and self.unavailable_groups[index] in (-1, *range(attempt, 100)):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker restarting")
        if index in self.hang_groups:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled_in_flight.append(request.group_id)
                raise
        plan = plan_from_proto(request.plan)
        [(member, target)] = plan.targets.items()
        version = self.trainer.version
        stale = index in self.stale_groups
        start = version - 5 if stale else version
        traces = []
        for i in range(request.n):
            rule = target.model.kind == "rule"
            completion = [STALE_TOKEN if stale else 20 + (task.idx + i) % 10, 21, 1]
            if index in self.oov_groups and i == 0:
                completion[0] = OOV_TOKEN
            logprob = 0.0 if rule else self.sampled_logprob
            if rule:
                reward = 1.0
            elif task.split == "eval":
                reward = min(1.0, 0.1 * version)
            elif target.sampling.temperature == 0:
                reward = 0.6 if version >= self.dev_good_from else 0.1
            else:
                reward = float(i % 2)
            errors = []
            if attempt <= self.retryable_error_groups.get(index, 0):
                errors = [TraceError("ModelCallError", "replica restarting", True)]
            if index in self.fatal_error_groups:
                errors = [TraceError("HarnessError", "KeyError: 'answer'", False)]
            nodes = [
                MessageNode("u", "user", [3, 10 + task.idx % 20], [False, False], content=f"task {task.idx}"),
                MessageNode(
                    "a", "assistant", completion, [True] * 3, [logprob] * 3, parent="u", content="cba"
                ),
            ]
            task.data = '{"answer": "cba"}'
            traces.append(
                Trace(
                    id=f"{request.group_id}/{i}",
                    task=task,
                    nodes=nodes,
                    branches=[Branch(["u", "a"])],
                    rollout_id=f"{request.group_id}/{i}",
                    group_id=request.group_id,
                    member_id=member,
                    reward=reward,
                    policy_span=(start, version),
                    errors=errors,
                    stop_condition="error" if errors else "completed",
                )
            )
        return env_pb2.RunGroupResponse(traces=[trace_to_proto(t) for t in traces])

    async def RunAlgorithms(self, request, context):
        self.algorithm_calls.append(request)
        results = []
        for msg in request.traces:
            trace = trace_from_proto(msg)
            n = trace.branch_length(0)
            mask = [False, False] + [True] * (n - 2)
            if self.algorithm_mask_length_error:
                mask = mask[:-1]
            values = [0.0, 0.0] + [self.algorithm_value] * (n - 2)
            results.append(
                env_pb2.BranchResult(
                    trace_id=trace.id,
                    branch_index=0,
                    mask=mask,
                    channels=[trace_pb2.AdvantageChannel(loss=trace_pb2.LOSS_TYPE_RL, values=values)],
                )
            )
        return env_pb2.RunAlgorithmsResponse(results=results)

    async def Cancel(self, request, context):
        self.cancels.extend(request.group_ids)
        return env_pb2.CancelResponse(cancelled=len(request.group_ids))


class FakeInference(inference_pb2_grpc.InferenceServiceServicer):
    """Score: every token gets logprob -0.25, after `delay`; records the peak concurrency.
    GetStatus reports the default model's tokenizer (configs/tokenizer/char), Detokenize
    decodes with it."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.active = 0
        self.peak = 0
        self.chars = CharTokenizer.from_file(REPO / CHAR_TOKENIZER)
        self.tokenizer = tokenizer_info(self.chars, CHAR_TOKENIZER)
        self.detokenized = 0

    async def Detokenize(self, request, context):
        self.detokenized += 1
        text = self.chars.decode(list(request.token_ids), request.skip_special_tokens)
        return inference_pb2.DetokenizeResponse(text=text)

    async def GetStatus(self, request, context):
        return inference_pb2.GetInferenceStatusResponse(tokenizer=tokenizer_info_to_proto(self.tokenizer))

    async def Score(self, request, context):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        return inference_pb2.ScoreResponse(logprobs=[-0.25] * (len(request.token_ids) - request.start))


@contextlib.asynccontextmanager
async def serving(name: str, add, servicer):
    server = GrpcServer(ServerOptions(host="127.0.0.1", port=0, shutdown_grace_s=0.0), [name])
    add(servicer, server.server)
    await server.start()
    server.set_serving(True)
    try:
        yield server.address
    finally:
        await server.stop(0.0)


class Stack:
    """A fake trainer, one fake env per env entry and one inference replica, all serving."""

    stale_token = STALE_TOKEN
    oov_token = OOV_TOKEN

    def __init__(self, trainer, envs, inference, addresses):
        self.trainer = trainer
        self.envs = envs
        self.inference = inference
        self.addresses = addresses

    @property
    def env(self) -> FakeEnv:
        return self.envs[0]

    def raw(self, tmp_path: Path, **orchestrator) -> dict:
        """A small run file: 2 groups of 2 per step, 4 RL steps, eval of 6 tasks every 2 steps;
        keyword arguments override [orchestrator] keys (and `trainer`, `grpc`, `env` tables)."""
        envs = orchestrator.pop("env", [{"id": "reverse-text"}])
        return {
            "name": "test",
            "output_dir": str(tmp_path / "run"),
            "model": {"max_model_len": 32},
            "inference": {"addresses": [self.addresses["inference"]]},
            "trainer": orchestrator.pop("trainer", {}) | {"address": self.addresses["trainer"]},
            "grpc": {"deadline_s": 30.0} | orchestrator.pop("grpc", {}),
            "orchestrator": {
                "max_steps": 4,
                "batch_size": 2,
                "group_size": 2,
                "startup_timeout_s": 20.0,
                "train": {
                    "sampling": {"max_completion_tokens": 8},
                    "env": [e | {"address": a} for e, a in zip(envs, self.addresses["envs"], strict=False)],
                },
                "eval": {"num_tasks": 6, "interval": 2},
                **orchestrator,
            },
        }

    def config(self, tmp_path: Path, **orchestrator):
        return resolve_config(self.raw(tmp_path, **orchestrator))[0]


@pytest.fixture
async def stack():
    trainer = FakeTrainer()
    envs = [FakeEnv(trainer), FakeEnv(trainer, env_id="arithmetic")]
    inference = FakeInference()
    async with contextlib.AsyncExitStack() as exits:
        addresses = {
            "trainer": await exits.enter_async_context(
                serving(TRAINER_SERVICE, trainer_pb2_grpc.add_TrainerServiceServicer_to_server, trainer)
            ),
            "inference": await exits.enter_async_context(
                serving(
                    INFERENCE_SERVICE, inference_pb2_grpc.add_InferenceServiceServicer_to_server, inference
                )
            ),
            "envs": [
                await exits.enter_async_context(
                    serving(ENV_SERVICE, env_pb2_grpc.add_EnvServiceServicer_to_server, e)
                )
                for e in envs
            ],
        }
        yield Stack(trainer, envs, inference, addresses)


@pytest.fixture
def serve():
    """`async with serve(service_name, add_fn, servicer) as address`: a servicer on 127.0.0.1."""
    return serving
