"""`rlrun eval CONFIG --checkpoint PATH` (or `--endpoint URL`): the run's eval envs against one
model, outside a training run.

With `--checkpoint` it starts an inference service on the checkpoint's weights; with
`--endpoint` the policy is an external OpenAI-compatible API (a target of kind `openai`). It
starts one env-server per env (as `rlrun local` does, with its process helpers), rolls out the
first `orchestrator.eval.num_tasks` tasks of every env's eval split with the eval's sampling
(greedy by default, pass@k when configured), and writes to the output folder:

- `results.jsonl`: one line per task as soon as it finishes (its rollouts, or why it failed);
  a rerun with the same folder runs the tasks that are missing or failed (a rollout errored, or
  the group could not be run) and skips the ones done, so an interrupted or partly failed eval
  resumes where it stopped; a task run again gets a new line, and the newest line of each task
  is the one that counts (every task once);
- `metrics.json`: the summary (mean reward, pass@k, per env, win rate for multi-agent envs);
- `eval_config.json`: what was evaluated (a rerun against another model is refused).

It prints a summary table; the last output line is the summary as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from rlrun.common.config import POLICY, ConfigError, ModelTargetConfig, RunConfig, reload_config
from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.service import serve_command
from rlrun.common.wire.inference import status_from_proto, status_request
from rlrun.common.wire.plan import GenerationPlan, TokenizerInfo
from rlrun.common.wire.trace import TaskRef
from rlrun.local.launcher import child_env, interrupts_raise, set_option
from rlrun.local.processes import ChildFailed, ProcessGroup
from rlrun.orchestrator.collect.env_client import EnvClient
from rlrun.orchestrator.collect.evaluation import eval_tasks, result_rows, summarize
from rlrun.orchestrator.collect.group import RolloutGroup
from rlrun.orchestrator.collect.rollouts import EnvRollouts, GroupFailure, run_group
from rlrun.orchestrator.run.connections import wait_for_env_server
from rlrun.orchestrator.run.context import eval_schedule
from rlrun.orchestrator.run.plan import compile_plan, eval_entries, member_temperatures, trained_members
from rlrun.v1 import inference_pb2_grpc

RESULTS = "results.jsonl"
METRICS = "metrics.json"
IDENTITY = "eval_config.json"
ENDPOINT_KEY = "eval_endpoint"
"""The model key the external endpoint plays under (a target of kind openai)."""
SPLIT = "eval"
COUNTS = frozenset({"k", "tasks", "rollouts", "failed_groups"})


@dataclass(frozen=True)
class EvalRequest:
    config: RunConfig
    config_path: Path
    overrides: list[str]
    checkpoint: Path | None
    endpoint: str | None
    endpoint_model: str | None
    api_key_env: str
    output_dir: Path
    progress: bool = True


def model_dir(checkpoint: Path) -> Path:
    """A trainer checkpoint (`checkpoints/step_N`, whose weights are in `model/`) or a Hugging
    Face model folder."""
    if (checkpoint / "model" / "config.json").exists():
        return checkpoint / "model"
    if (checkpoint / "config.json").exists():
        return checkpoint
    if (checkpoint / "adapter").is_dir():
        raise ConfigError(
            "--checkpoint",
            f"{checkpoint} is a LoRA checkpoint (an adapter, not a model): write the merged model "
            f"with `rlrun export {checkpoint} --out DIR --merged --config CONFIG`, then pass "
            "--checkpoint DIR/merged",
        )
    raise ConfigError(
        "--checkpoint", f"{checkpoint} is neither a trainer checkpoint (model/config.json) nor a model folder"
    )


def identity(request: EvalRequest) -> dict:
    orch = request.config.orchestrator
    return {
        "config": str(request.config_path),
        "model": str(request.checkpoint.resolve()) if request.checkpoint else request.endpoint,
        "envs": list(eval_entries(request.config)),
        "num_tasks": orch.eval.num_tasks,
        "pass_k": orch.eval.pass_k,
        "greedy": orch.eval.greedy,
    }


def read_results(path: Path) -> dict[tuple[str, int], dict]:
    """The tasks already run: (env, task idx) -> their newest line (a task run again by a resume
    has a later one). A line cut short by an interrupt (the last one) is dropped and the task
    runs again."""
    done: dict[tuple[str, int], dict] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[(record["env"], record["task_idx"])] = record
    return done


def needs_rerun(record: dict) -> bool:
    """A task a resume runs again: its group failed (a rollout errored past its retries, or the
    env-server could not run it), so it has no rollouts to count."""
    return bool(record.get("failed"))


def eval_plans(
    request: EvalRequest, tokenizer: TokenizerInfo, text_addresses: list[str]
) -> tuple[RunConfig, dict[str, GenerationPlan]]:
    """Per env, the eval plan: the checkpoint's replicas, or the endpoint as an openai target."""
    config = request.config
    orch = config.orchestrator
    actor = POLICY
    if request.endpoint:
        target = ModelTargetConfig(
            kind="openai",
            base_url=request.endpoint,
            model=request.endpoint_model or config.name,
            api_key_env=request.api_key_env,
        )
        config = config.model_copy(
            update={"orchestrator": orch.model_copy(update={"models": {**orch.models, ENDPOINT_KEY: target}})}
        )
        actor = ENDPOINT_KEY
    plans = {
        key: compile_plan(
            config,
            actor=actor,
            sampling=sampling,
            tokenizer=tokenizer,
            text_addresses=text_addresses,
        )
        for key, (_, sampling) in eval_entries(config).items()
    }
    return config, plans


class EvalServices:
    """The inference service (with --checkpoint) and one env-server per env, as `rlrun local`
    starts them; their logs go to `<output>/logs`."""

    def __init__(self, request: EvalRequest):
        self.request = request
        self.group = ProcessGroup(child_env())
        self.log_dir = request.output_dir / "logs"
        self.inference: list[str] = []
        self.env_servers: dict[str, str] = {}
        self.sets: list[str] = []
        """The KEY=VALUE overrides that wire the started services (their addresses)."""

    def _start(self, name: str, service: str, *extra: str) -> str:
        overrides = [arg for o in self.request.overrides for arg in ("--set", o)]
        argv = serve_command(service, self.request.config_path, self.log_dir, *overrides, *extra)
        return self.group.start(name, argv, self.log_dir / f"{name}.log").address

    def start(self) -> None:
        request = self.request
        sets: list[str] = []
        if request.checkpoint is not None:
            address = self._start(
                "inference", "inference", *set_option("model.path", str(model_dir(request.checkpoint)))
            )
            self.inference = [address]
            sets += set_option("inference.addresses", self.inference)
        for key, target in request.config.orchestrator.models.items():
            if target.kind == "inference" and not target.addresses:
                model_sets = set_option("model.path", target.checkpoint) if target.checkpoint else []
                address = self._start(f"inference-{key}", "inference", *model_sets)
                sets += set_option(f"orchestrator.models.{key}.addresses", [address])
        self.sets = [sets[i + 1] for i in range(0, len(sets), 2)]
        for env, _ in eval_entries(request.config).values():
            if env.address:
                self.env_servers[env.key] = env.address
                continue
            self.env_servers[env.key] = self._start(
                f"env-server-{env.key}", "env-server", *sets, "--env", env.key
            )

    def stop(self) -> None:
        self.group.stop()


async def served_tokenizer(addresses: list[str], options: ClientOptions) -> TokenizerInfo:
    if not addresses:
        return TokenizerInfo()
    async with open_channel(addresses[0], options) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        return status_from_proto(await stub.GetStatus(status_request(), timeout=60.0)).tokenizer


def task_record(env: str, task: TaskRef, outcome: RolloutGroup | GroupFailure) -> dict:
    if isinstance(outcome, GroupFailure):
        return {"env": env, "task_idx": task.idx, "failed": outcome.reason, "rows": []}
    return {"env": env, "task_idx": task.idx, "rows": result_rows([outcome])}


async def evaluate(
    request: EvalRequest, services: EvalServices, on_done: Callable[[int, int], None]
) -> dict[str, float]:
    """Runs every task not yet in results.jsonl, appending each as it finishes; the summary."""
    wired = reload_config(request.config_path, [*request.overrides, *services.sets])
    options = ClientOptions.from_config(wired.grpc)
    tokenizer = await served_tokenizer(services.inference, options)
    config, plans = eval_plans(replace(request, config=wired), tokenizer, services.inference)
    orch = config.orchestrator
    clients = {key: EnvClient(address, options) for key, address in services.env_servers.items()}
    results = request.output_dir / RESULTS
    try:
        await asyncio.gather(
            *(wait_for_env_server(a, options, orch.startup_timeout_s) for a in services.env_servers.values())
        )
        targets, tasks = {}, []
        schedule = eval_schedule(config, plans)
        for key, (env, _) in eval_entries(config).items():
            description = await clients[key].describe(key, env.id)
            plan = plans[key]
            targets[key] = EnvRollouts(
                key,
                clients[key],
                plan,
                trained_members(plan, orch.multi_agent.drop_judge),
                member_temperatures(plan),
            )
            tasks += eval_tasks({key: description.task_counts.get(SPLIT, 0)}, SPLIT, schedule[key].num_tasks)
        done = read_results(results)
        todo = [t for t in tasks if (t.env, t.idx) not in done or needs_rerun(done[(t.env, t.idx)])]
        on_done(len(tasks) - len(todo), len(tasks))
        slots = asyncio.Semaphore(orch.inflight_groups)

        async def one(task: TaskRef) -> None:
            async with slots:
                outcome = await run_group(
                    targets[task.env],
                    f"eval-{task.env}-{task.idx:05d}",
                    task,
                    orch.eval.pass_k,
                    version=lambda: 0,
                    max_retries=orch.max_retries,
                    timeout_s=orch.rollout_timeout_s,
                )
            record = task_record(task.env, task, outcome)
            with results.open("a") as out:
                out.write(json.dumps(record) + "\n")
            done[(task.env, task.idx)] = record
            on_done(1, len(tasks))

        async with asyncio.TaskGroup() as running:
            for task in todo:
                running.create_task(one(task))
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)
    wanted = {(t.env, t.idx) for t in tasks}
    records = [r for key, r in done.items() if key in wanted]
    rows = [row for r in records for row in r["rows"]]
    failed = sum(1 for r in records if r.get("failed"))
    return summarize(rows, orch.eval.pass_k, orch.eval.solved_threshold, failed)


def summary_table(summary: dict[str, float]) -> str:
    width = max(len(k) for k in summary)
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  -------"]
    for key, value in summary.items():
        shown = f"{value:.0f}" if key in COUNTS else f"{value:.4f}"
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)


def check_identity(request: EvalRequest) -> None:
    path = request.output_dir / IDENTITY
    mine = identity(request)
    if path.exists():
        theirs = json.loads(path.read_text())
        if theirs != mine:
            raise SystemExit(
                f"rlrun eval: {request.output_dir} holds an eval of something else ({theirs}); "
                "choose another --output-dir"
            )
    request.output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=2))


def run_eval_command(request: EvalRequest) -> int:
    check_identity(request)
    out = request.output_dir
    before = read_results(out / RESULTS)
    if before:
        failed = sum(needs_rerun(r) for r in before.values())
        print(
            f"rlrun eval: resuming: {len(before) - failed} tasks already in {out / RESULTS}; "
            f"{failed} failed there and run again",
            file=sys.stderr,
        )
    started = time.monotonic()
    services = EvalServices(request)
    bar: tqdm | None = None

    def on_done(count: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(
                total=total, unit="task", disable=not request.progress, file=sys.stderr, dynamic_ncols=True
            )
        bar.update(count)

    with interrupts_raise():
        try:
            services.start()
            summary = asyncio.run(evaluate(request, services, on_done))
        except KeyboardInterrupt:
            done = sum(not needs_rerun(r) for r in read_results(out / RESULTS).values())
            print(
                f"\nrlrun eval: interrupted; {done} tasks are in {out / RESULTS}. "
                "Run the same command again to resume.",
                file=sys.stderr,
            )
            return 130
        except ChildFailed as error:
            print(f"rlrun eval: {error}", file=sys.stderr)
            return 1
        finally:
            if bar is not None:
                bar.close()
            services.stop()
    summary["wall_s"] = round(time.monotonic() - started, 3)
    (out / METRICS).write_text(json.dumps(summary, indent=2))
    print(summary_table(summary))
    print(f"rlrun eval: results {out / RESULTS}, metrics {out / METRICS}", file=sys.stderr)
    print(json.dumps(summary), flush=True)
    return 0
