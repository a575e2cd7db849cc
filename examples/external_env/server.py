"""An env-server written against the rlrun.v1 contract alone.

It imports nothing from rlrun but the generated `rlrun.v1` stubs (plus grpcio and the
standard library), to show that env.proto and the files it imports are all an external
environment needs. It needs no grpc.health.v1 either: the orchestrator polls GetInfo. It
renders token ids itself (token level: Generate), so it declares its tokenizer in GetInfo;
examples/external_env_node shows the text level (GenerateChat), with no tokenizer. It serves one environment, `reverse-text` (reverse a string of
lowercase letters; reward 1 − normalised edit distance), with the rlrun chat format for the
in-repo character tokenizer, and implements the whole EnvService: GetInfo, RunRollout,
RunGroup (one Generate call with n = group size), RunAlgorithms (it owns none) and Cancel.

    python examples/external_env/server.py --port 50070
    # then, in the run config:  [[orchestrator.train.env]]  id = "reverse-text"  address = "127.0.0.1:50070"

It prints `external env-server listening on HOST:PORT` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import string
import time
import uuid
from pathlib import Path

import grpc

from rlrun.v1 import env_pb2, env_pb2_grpc, inference_pb2, inference_pb2_grpc, plan_pb2, trace_pb2

ENV_ID = "reverse-text"
TRAIN_SIZE = 1_000_000
EVAL_BUCKETS = 16
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}


class BadRequest(Exception):
    """Invalid input; the message starts with the offending field."""


class ChatFormat:
    """The rlrun chat format for a character tokenizer folder (Hugging Face's tokenizer.json:
    the specials, then one vocabulary entry per character): `<|role|>` content `<|end|>`."""

    def __init__(self, path: Path):
        spec = json.loads((path / "tokenizer.json").read_text())
        self.name = f"char:{path.name}"  # how inference names a character tokenizer folder
        vocab = spec["model"]["vocab"]
        self.vocab = sorted(vocab, key=vocab.get)
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        self.specials = sum(1 for token in spec["added_tokens"] if token["special"])
        self.end = self.ids["<|end|>"]
        self.unknown = self.ids[spec["model"]["unk_token"]]

    def header(self, role: str) -> list[int]:
        return [self.ids[f"<|{role}|>"]]

    def message(self, role: str, content: str) -> list[int]:
        return self.header(role) + [self.ids.get(ch, self.unknown) for ch in content] + [self.end]

    def text(self, token_ids) -> str:
        return "".join(self.vocab[t] for t in token_ids if self.specials <= t < len(self.vocab))


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


class ReverseText:
    """Train tasks are drawn on demand from (seed, idx); eval is a fixed set. A string belongs
    to eval exactly when its hash falls in bucket 0, so the splits never overlap."""

    def __init__(self, seed: int, eval_size: int, min_len: int = 3, max_len: int = 8):
        self.seed, self.min_len, self.max_len = seed, min_len, max_len
        rng, found = random.Random(f"{seed}:eval"), {}
        while len(found) < eval_size:
            text = self._draw(rng)
            if self._is_eval(text):
                found.setdefault(text, None)
        self.eval = list(found)

    def _draw(self, rng: random.Random) -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_len, self.max_len)))

    @staticmethod
    def _is_eval(text: str) -> bool:
        return (
            int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % EVAL_BUCKETS
            == 0
        )

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": TRAIN_SIZE, "eval": len(self.eval)}

    def text(self, split: str, idx: int) -> str:
        if split == "eval":
            return self.eval[idx]
        rng = random.Random(f"{self.seed}:train:{idx}")
        while True:
            text = self._draw(rng)
            if not self._is_eval(text):
                return text

    @staticmethod
    def score(answer: str, text: str) -> float:
        target = text[::-1]
        longest = max(len(answer), len(target))
        return 1.0 if longest == 0 else 1.0 - edit_distance(answer, target) / longest


def check_plan(plan: plan_pb2.GenerationPlan, vocab_size: int) -> plan_pb2.PlanTarget:
    if len(plan.targets) != 1:
        raise BadRequest(
            f"plan.targets: a single-agent env needs exactly one target, got {len(plan.targets)}"
        )
    target, at = plan.targets[0], "plan.targets[0]"
    if target.model.kind not in (plan_pb2.ENDPOINT_KIND_INFERENCE, plan_pb2.ENDPOINT_KIND_RULE):
        raise BadRequest(f"{at}.model.kind: unknown or unspecified endpoint kind")
    if target.model.kind == plan_pb2.ENDPOINT_KIND_INFERENCE and not target.model.addresses:
        raise BadRequest(f"{at}.model.addresses: empty for an inference target")
    s = target.sampling
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise BadRequest(f"{at}.sampling.temperature: must be a finite number >= 0, got {s.temperature}")
    if s.HasField("top_p") and not 0 < s.top_p <= 1:
        raise BadRequest(f"{at}.sampling.top_p: must be in (0, 1], got {s.top_p}")
    if s.HasField("top_k") and s.top_k < 0:
        raise BadRequest(f"{at}.sampling.top_k: must be >= 0, got {s.top_k}")
    if s.max_tokens <= 0:
        raise BadRequest(f"{at}.sampling.max_tokens: must be positive, got {s.max_tokens}")
    for i, token in enumerate(s.stop_token_ids):
        if not 0 <= token < vocab_size:
            raise BadRequest(f"{at}.sampling.stop_token_ids[{i}]: {token} is outside the vocabulary")
    return target


class ExternalEnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, chat: ChatFormat, env: ReverseText, max_model_len: int):
        self.chat, self.env, self.max_model_len = chat, env, max_model_len
        self.stubs: dict[str, inference_pb2_grpc.InferenceServiceStub] = {}
        self.turn = 0
        self.running: dict[
            str, tuple[set[str], int, asyncio.Event]
        ] = {}  # job -> (group + rollout ids, n, cancel)

    # -- helpers -------------------------------------------------------------------------------

    def stub(self, addresses) -> inference_pb2_grpc.InferenceServiceStub:
        self.turn += 1
        address = addresses[self.turn % len(addresses)]
        if address not in self.stubs:
            self.stubs[address] = inference_pb2_grpc.InferenceServiceStub(grpc.aio.insecure_channel(address))
        return self.stubs[address]

    def task(self, ref: trace_pb2.TaskRef) -> str:
        if ref.env != ENV_ID:
            raise BadRequest(f"task.env: this env-server hosts no env {ref.env!r}; it hosts ['{ENV_ID}']")
        sizes = self.env.sizes
        if ref.split not in sizes:
            raise BadRequest(f"task.split: unknown split {ref.split!r}; expected one of {sorted(sizes)}")
        if not 0 <= ref.idx < sizes[ref.split]:
            raise BadRequest(f"task.idx: {ref.idx} is out of range [0, {sizes[ref.split]})")
        return self.env.text(ref.split, ref.idx)

    async def generate(self, target: plan_pb2.PlanTarget, text: str, prompt: list[int], n: int):
        """n completions as (token_ids, logprobs, finish_reason, version start, version end)."""
        if target.model.kind == plan_pb2.ENDPOINT_KIND_RULE:
            tokens = self.chat.message("assistant", text[::-1])[1:][: target.sampling.max_tokens]
            finish = (
                inference_pb2.FINISH_REASON_STOP
                if tokens[-1] == self.chat.end
                else inference_pb2.FINISH_REASON_LENGTH
            )
            return [(tokens, [0.0] * len(tokens), finish, 0, 0)] * n
        sampling = inference_pb2.GenerateRequest().sampling
        sampling.CopyFrom(target.sampling)
        sampling.n = n
        # The plan's stop_token_ids already end a reply at <|end|>; only the context is ours to fit.
        sampling.max_tokens = min(sampling.max_tokens, self.max_model_len - len(prompt))
        reply = await self.stub(target.model.addresses).Generate(
            inference_pb2.GenerateRequest(
                request_id=uuid.uuid4().hex, prompt_token_ids=prompt, sampling=sampling
            )
        )
        if len(reply.completions) != n:
            raise ValueError(f"inference returned {len(reply.completions)} completions for n = {n}")
        out = []
        for c in reply.completions:
            if (
                len(c.logprobs) != len(c.token_ids)
                or c.finish_reason == inference_pb2.FINISH_REASON_UNSPECIFIED
            ):
                raise ValueError("inference returned a malformed completion")
            out.append(
                (
                    list(c.token_ids),
                    list(c.logprobs),
                    c.finish_reason,
                    c.policy_version_start,
                    c.policy_version_end,
                )
            )
        return out

    def trace(self, rollout_id: str, group_id: str, ref: trace_pb2.TaskRef, text: str) -> trace_pb2.Trace:
        task = trace_pb2.TaskRef(env=ENV_ID, split=ref.split, idx=ref.idx, data=json.dumps({"text": text}))
        task.example_id.str_value = text
        trace = trace_pb2.Trace(
            id=rollout_id, rollout_id=rollout_id, group_id=group_id, task=task, member_id="policy"
        )
        prompt = self.chat.message("user", text)
        trace.nodes.add(
            id="n0",
            role=trace_pb2.ROLE_USER,
            content=text,
            token_ids=prompt,
            sampled_mask=[False] * len(prompt),
        )
        return trace

    async def rollouts(
        self, ref, plan, group_id: str, rollout_ids: list[str], context
    ) -> list[trace_pb2.Trace]:
        text = self.task(ref)
        target = check_plan(plan, len(self.chat.vocab))
        started = time.perf_counter()
        traces = [self.trace(rid, group_id, ref, text) for rid in rollout_ids]
        prompt = self.chat.message("user", text) + self.chat.header("assistant")
        job, cancel = uuid.uuid4().hex, asyncio.Event()
        self.running[job] = ({group_id, *rollout_ids} - {""}, len(rollout_ids), cancel)
        remaining = context.time_remaining()
        timeout = None if remaining is None else max(0.001, remaining - max(0.05, 0.05 * remaining))
        work = asyncio.ensure_future(self.generate(target, text, prompt, len(rollout_ids)))
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            done, _ = await asyncio.wait({work, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            del self.running[job]
        if work not in done:
            work.cancel()
            stop, error = (
                (trace_pb2.STOP_CONDITION_CANCELLED, ("Cancelled", "cancelled by the orchestrator", False))
                if cancel.is_set()
                else (trace_pb2.STOP_CONDITION_ERROR, ("Timeout", "the rollout did not finish in time", True))
            )
            for trace in traces:
                trace.stop_condition = stop
                trace.errors.add(type=error[0], message=error[1], retryable=error[2])
            return traces
        try:
            completions = work.result()
        except grpc.aio.AioRpcError as failure:
            for trace in traces:
                trace.stop_condition = trace_pb2.STOP_CONDITION_ERROR
                trace.errors.add(
                    type="ModelCallError",
                    message=f"{failure.code().name}: {failure.details()}",
                    retryable=failure.code() in RETRYABLE,
                )
            return traces
        except ValueError as failure:
            for trace in traces:
                trace.stop_condition = trace_pb2.STOP_CONDITION_ERROR
                trace.errors.add(type="InvalidModelOutput", message=str(failure), retryable=True)
            return traces
        generation_s = time.perf_counter() - started
        for trace, (tokens, logprobs, finish, start, end) in zip(traces, completions, strict=True):
            header = self.chat.header("assistant")
            answer = self.chat.text(tokens)
            trace.nodes.add(
                id="n1",
                parent="n0",
                role=trace_pb2.ROLE_ASSISTANT,
                content=answer,
                token_ids=header + tokens,
                sampled_mask=[False] * len(header) + [True] * len(tokens),
                logprobs=logprobs,
            )
            trace.branches.add(node_ids=["n0", "n1"])
            score = self.env.score(answer, text)
            trace.rewards["similarity"].score = score
            trace.rewards["similarity"].weight = 1.0
            trace.reward = score
            truncated = finish == inference_pb2.FINISH_REASON_LENGTH
            trace.is_truncated = truncated
            trace.stop_condition = (
                trace_pb2.STOP_CONDITION_LENGTH if truncated else trace_pb2.STOP_CONDITION_COMPLETED
            )
            trace.policy_span.start, trace.policy_span.end = start, end
            trace.timing.generation_s = generation_s
            trace.timing.total_s = time.perf_counter() - started
        return traces

    # -- RPCs ----------------------------------------------------------------------------------

    async def GetInfo(self, request, context):
        # This server renders token ids itself, so it declares its tokenizer: the run refuses to
        # start when the model serves another. No temperature is declared: it samples at the
        # plan's, which is the one the trainer uses.
        info = env_pb2.EnvInfo(
            env_id=ENV_ID,
            task_counts=self.env.sizes,
            tokenizer=plan_pb2.TokenizerInfo(name=self.chat.name, vocab_size=len(self.chat.vocab)),
            reward_range=env_pb2.RewardRange(min=0.0, max=1.0),
        )
        return env_pb2.GetInfoResponse(envs=[info])

    async def RunRollout(self, request, context):
        try:
            rollout_id = request.rollout_id or uuid.uuid4().hex
            traces = await self.rollouts(request.task, request.plan, request.group_id, [rollout_id], context)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return env_pb2.RunRolloutResponse(traces=traces)

    async def RunGroup(self, request, context):
        try:
            if request.n <= 0:
                raise BadRequest(f"n: must be positive, got {request.n}")
            group_id = request.group_id or uuid.uuid4().hex
            rollout_ids = [f"{group_id}/{i}" for i in range(request.n)]
            traces = await self.rollouts(request.task, request.plan, group_id, rollout_ids, context)
        except BadRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return env_pb2.RunGroupResponse(traces=traces)

    async def RunAlgorithms(self, request, context):
        if request.env_id != ENV_ID:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"env_id: no env {request.env_id!r} here")
        if request.algorithms:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"algorithms[0]: env {ENV_ID!r} has no algorithm {request.algorithms[0]!r}",
            )
        return env_pb2.RunAlgorithmsResponse()

    async def Cancel(self, request, context):
        wanted = set(request.group_ids) | set(request.rollout_ids)
        cancelled = 0
        for ids, n, cancel in self.running.values():
            if ids & wanted and not cancel.is_set():
                cancel.set()
                cancelled += n
        return env_pb2.CancelResponse(cancelled=cancelled)


async def serve(args: argparse.Namespace) -> None:
    chat = ChatFormat(args.tokenizer)
    servicer = ExternalEnvServicer(chat, ReverseText(args.seed, args.eval_size), args.max_model_len)
    server = grpc.aio.server()
    env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    print(f"external env-server listening on {args.host}:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = OS-assigned")
    parser.add_argument("--tokenizer", type=Path, default=Path("configs/tokenizer/char"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=32, help="context length of the model")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
