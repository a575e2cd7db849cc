"""The `rlrun` command: local, eval, dashboard, serve <service>, check-config, export, operator,
bench."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import sys
from pathlib import Path

from rlrun.checks import Scope, check_run
from rlrun.common.arguments import non_negative, port
from rlrun.common.config import ConfigError, load_config_with_warnings
from rlrun.common.hub import resolve_hub_model
from rlrun.dashboard import cli as dashboard_cli

SERVICES = {
    "inference": "rlrun.inference.cli",
    "env-server": "rlrun.env_server.cli",
    "orchestrator": "rlrun.orchestrator.cli",
    "trainer": "rlrun.trainer.cli",
}
BENCHMARKS = {
    "inference": (
        "rlrun.bench.inference",
        "torch engine vs a raw batched decode loop and sequential generate",
    ),
    "env-server": ("rlrun.bench.env_server", "env-server overhead per rollout vs calling inference directly"),
    "sandbox": (
        "rlrun.bench.sandbox",
        "local (bubblewrap) sandboxes/s created and destroyed; per-command time vs running it directly",
    ),
    "trainer": ("rlrun.bench.trainer", "trainer step vs a bare torch loop; broadcast vs a raw gRPC stream"),
    "orchestrator": ("rlrun.bench.orchestrator", "traces/s through algorithms, flattening and batching"),
    "async": (
        "rlrun.bench.async_overlap",
        "async (max_off_policy_steps=1) vs sync step time, against the bound",
    ),
    "memory": (
        "rlrun.bench.memory",
        "env-server and inference memory after 20 rounds of steady load vs after round 2",
    ),
    "stack": ("rlrun.bench.stack", "the rlrun local service stack vs the same RL loop in one process"),
    "verifiers": (
        "rlrun.bench.verifiers",
        "a one-turn verifiers env's env-server and RL step vs the same task as a native env",
    ),
    "gpu": (
        "rlrun.bench.gpu",
        "served engine, learner, weight sync and rlrun local on one GPU, each vs its baseline",
    ),
    "operator-scale": (
        "rlrun.bench.operator_scale",
        "the operator with 50 runs (500 kwok pods) in 1 and in 10 namespaces vs 1 run, on a real control plane",
    ),
}
BENCHMARK_OPTIONS = {"gpu", "operator-scale"}
"""Benchmarks with options of their own: their modules define `add_arguments(parser)` and
import nothing heavy at the top (the parser is built on every `rlrun` call)."""


def _add_config_args(parser: argparse.ArgumentParser, positional: bool) -> None:
    if positional:
        parser.add_argument("config", type=Path, help="run file (TOML), e.g. configs/reverse_text.toml")
    else:
        parser.add_argument("--config", type=Path, required=True, help="run file (TOML)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set orchestrator.train.sampling.temperature=0.7 (repeatable)",
    )


def _load_module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            raise SystemExit(
                f"rlrun: {what} is not available in this installation ({name} is missing)"
            ) from None
        raise


def _add_eval_parser(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate a checkpoint (or an OpenAI-compatible endpoint) on the run's eval envs",
        description="Roll out the first orchestrator.eval.num_tasks tasks of the eval split of every "
        "eval env of the run file ([[orchestrator.eval.env]], each with its own num_tasks and "
        "sampling; without any, the training envs) against one model, with the eval's sampling (greedy by default; "
        "pass@k with orchestrator.eval.pass_k), and print a summary table. --checkpoint starts an "
        "inference service on a trainer checkpoint (outputs/<name>/checkpoints/step_N) or a model "
        "folder; --endpoint uses an external OpenAI-compatible API instead (its key from the env "
        "var --api-key-env names). Env-servers are started as `rlrun local` starts them. The output "
        "folder gets results.jsonl (one line per task, written as each finishes), metrics.json and "
        "the services' logs. Ctrl-C stops; the same command again resumes, skipping the tasks "
        "already done in results.jsonl and running again those that failed there (each task "
        "counts once). The last output line is the summary as JSON.",
    )
    _add_config_args(ev, positional=True)
    model = ev.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=Path, help="trainer checkpoint folder (step_N) or model folder")
    model.add_argument(
        "--endpoint", metavar="URL", help="base URL of an OpenAI-compatible API, e.g. http://host:8000/v1"
    )
    ev.add_argument(
        "--endpoint-model", metavar="NAME", help="model name sent to --endpoint (default: the run's name)"
    )
    ev.add_argument(
        "--api-key-env",
        default="",
        metavar="VAR",
        help="environment variable holding --endpoint's API key (default: none sent)",
    )
    ev.add_argument(
        "--output-dir",
        type=Path,
        help="output folder (default: <run output folder>/eval/<checkpoint folder name or 'endpoint'>)",
    )
    ev.add_argument("--num-tasks", type=int, help="tasks per env (overrides orchestrator.eval.num_tasks)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlrun",
        description="Asynchronous RL post-training of language models as gRPC microservices.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local = sub.add_parser(
        "local",
        help="run the whole loop on this machine (all services as local processes)",
        description="Start inference, env-server(s), trainer and orchestrator as local processes "
        "on loopback, run the configured warm start and RL steps, and write logs, metrics, eval "
        "results, checkpoints and a reward plot to the output folder. A service that dies is "
        "restarted, and the run goes on from the trainer's newest checkpoint. Ctrl-C stops after "
        "the current step with a checkpoint; the same command again resumes (--fresh starts "
        "over). Each service serves Prometheus /metrics; the output folder gets "
        "prometheus_targets.json (file_sd). The last output line is JSON.",
    )
    _add_config_args(local, positional=True)
    local.add_argument("--output-dir", type=Path, help="output folder (default: outputs/<name>)")
    local.add_argument("--max-steps", type=int, help="RL steps (overrides orchestrator.max_steps)")
    local.add_argument("--no-progress", action="store_true", help="no progress bar (log lines instead)")
    local.add_argument(
        "--fresh",
        action="store_true",
        help="delete the output folder's earlier run (checkpoints, metrics, evals, logs) and start "
        "over; without it a folder with checkpoints is resumed from the newest",
    )
    local.add_argument(
        "--no-dashboard",
        action="store_true",
        help="do not register the run with the dashboard, nor start one (see `rlrun dashboard`)",
    )
    local.add_argument(
        "--max-restarts",
        type=non_negative,
        default=5,
        metavar="N",
        help="restarts of each service after it dies (with backoff) before the run gives up; "
        "0 = none (default: 5)",
    )

    _add_eval_parser(sub)

    dash = sub.add_parser(
        "dashboard",
        help="a local web page with the runs' curves and a trace viewer",
        description=dashboard_cli.DESCRIPTION,
    )
    dashboard_cli.add_arguments(dash)

    serve = sub.add_parser(
        "serve",
        help="run one service",
        description="Run one rlrun service. When ready it prints "
        "exactly one line, `rlrun <service> listening on HOST:PORT`, then serves until SIGTERM.",
    )
    services = serve.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name, module in SERVICES.items():
        try:
            service = importlib.import_module(module)
        except ModuleNotFoundError:
            service = None
        ready = (
            f"When ready it prints exactly one line, `rlrun {name} listening on HOST:PORT`, "
            "then serves until SIGTERM."
        )
        p = services.add_parser(
            name,
            help=f"run the {name} service",
            description=f"{service.DESCRIPTION} {ready}" if service is not None else ready,
        )
        _add_config_args(p, positional=False)
        p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
        p.add_argument("--port", type=port, default=0, help="gRPC port; 0 = OS-assigned (default: 0)")
        p.add_argument(
            "--metrics-port",
            type=port,
            default=None,
            help="Prometheus /metrics port; 0 = OS-assigned (default: off)",
        )
        p.add_argument(
            "--log-dir",
            type=Path,
            default=None,
            help="folder for the service log file (default: <output_dir>/logs)",
        )
        p.set_defaults(service_module=module)
        if service is None:
            p.set_defaults(service_missing=True)
        else:
            service.add_arguments(p)

    check = sub.add_parser(
        "check-config",
        help="validate a run file and print the resolved config as JSON",
        description="Validate a run file (translating deprecated keys, with one warning each) and "
        "print the resolved config as JSON. Beyond the schema it checks, without starting "
        "anything, the algorithm ids and their algorithm_args, that the files the run reads "
        "exist, that env ids resolve and their args fit, and that the devices exist. Exits 2 "
        "with the offending key path on error.",
    )
    _add_config_args(check, positional=True)
    check.add_argument(
        "--no-devices",
        action="store_true",
        help="skip the device check (for a file meant for another machine)",
    )

    export = sub.add_parser(
        "export",
        help="write a LoRA checkpoint's adapter in the PEFT format (and a merged HF checkpoint)",
        description="Write the adapter of a LoRA run's checkpoint (a step_<N> folder) to OUT/adapter "
        "in the PEFT format (adapter_config.json + adapter_model.safetensors), which "
        "peft.PeftModel.from_pretrained loads onto the base model. With --merged, also OUT/merged: "
        "the base model of the run file with the adapters folded in, as a Hugging Face checkpoint. "
        "Exits 2 naming what is wrong.",
    )
    export.add_argument(
        "checkpoint", type=Path, help="a checkpoint folder, e.g. outputs/run/checkpoints/step_20"
    )
    export.add_argument("--out", type=Path, required=True, help="the folder to write")
    export.add_argument(
        "--merged",
        action="store_true",
        help="also write the merged model (needs --config: the base is the run file's [model])",
    )
    export.add_argument("--config", type=Path, help="the run file of the checkpoint's run (for --merged)")
    export.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="as for the run"
    )

    op = sub.add_parser(
        "operator",
        help="run the Kubernetes operator (kopf) for RLRun resources",
        description="Run the kopf operator that reconciles RLRun custom resources.",
    )
    try:
        importlib.import_module("rlrun.operator.cli").add_arguments(op)
    except ModuleNotFoundError:
        op.set_defaults(operator_missing=True)

    bench = sub.add_parser(
        "bench",
        help="run a benchmark; the last output line is JSON",
        description="Run a benchmark. Each prints a ratio against a baseline measured in the same "
        "run and ends with one JSON line. Benchmarks: "
        + "; ".join(f"{k}: {v[1]}" for k, v in BENCHMARKS.items()),
    )
    names = bench.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, (module, summary) in sorted(BENCHMARKS.items()):
        one = names.add_parser(name, help=summary, description=f"{summary}. The last output line is JSON.")
        one.add_argument("--quick", action="store_true", help="fewer iterations (for smoke tests)")
        one.add_argument("--output", type=Path, help="also write the JSON result to this file")
        if name in BENCHMARK_OPTIONS:
            with contextlib.suppress(ModuleNotFoundError):  # `_bench` says it is missing
                importlib.import_module(module).add_arguments(one)
    return parser


def load_run_config(path: Path, overrides: list[str]):
    """The run file, with each deprecation warning printed once to stderr (the loader does not
    log them: the CLI is their one reporter)."""
    config, warnings = load_config_with_warnings(path, overrides)
    for warning in warnings:
        print(f"warning: {path}: {warning}", file=sys.stderr)
    return config


def _invalid(error: ConfigError, command: str) -> int:
    print(f"{command}: invalid config: {error}", file=sys.stderr)
    return 2


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_run_config(args.config, args.overrides)
        # The file alone: how many ranks run the trainer is up to whatever launches it.
        check_run(config, Scope(devices=not args.no_devices, trainer_ranks=None))
    except ConfigError as error:
        return _invalid(error, "rlrun check-config")
    print(config.model_dump_json(indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rlrun.common.service import stop_with_launcher

    stop_with_launcher()
    if getattr(args, "service_missing", False):
        raise SystemExit(f"rlrun: the {args.service} service is not available in this installation")
    try:
        config = resolve_hub_model(load_run_config(args.config, args.overrides))
        check_run(config, Scope.service(args.service, getattr(args, "env_names", None)))
    except ConfigError as error:
        return _invalid(error, f"rlrun serve {args.service}")
    return _load_module(args.service_module, f"the {args.service} service").main(config, args)


def _local(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"orchestrator.max_steps={args.max_steps}")
    if args.output_dir is not None:
        overrides.append(f"output_dir={json.dumps(str(args.output_dir))}")
    try:
        config = load_run_config(args.config, overrides)
        # A Hub model is downloaded here, once; the services look up the same commit in the cache.
        config = resolve_hub_model(config)
        if config.model.hub_id is not None:
            overrides.append(f"model.hub_revision={json.dumps(config.model.hub_revision)}")
        check_run(config)
    except ConfigError as error:
        return _invalid(error, "rlrun local")
    launcher = _load_module("rlrun.local.launcher", "`rlrun local`")
    return launcher.run_local(
        config,
        config_path=args.config,
        overrides=overrides,
        progress=not args.no_progress,
        fresh=args.fresh,
        max_restarts=args.max_restarts,
        dashboard=not args.no_dashboard,
    )


def _export(args: argparse.Namespace) -> int:
    if args.merged and args.config is None:
        print("rlrun export: --merged needs --config (the run file names the base model)", file=sys.stderr)
        return 2
    config = None
    if args.merged:
        try:
            config = resolve_hub_model(load_run_config(args.config, args.overrides))
        except ConfigError as error:
            return _invalid(error, "rlrun export")
    export = _load_module("rlrun.trainer.export", "`rlrun export`")
    checkpoint = _load_module("rlrun.trainer.checkpoint", "`rlrun export`")
    try:
        written = export.export_checkpoint(args.checkpoint, args.out, config)
    except (export.ExportError, checkpoint.CorruptCheckpoint, FileNotFoundError) as error:
        print(f"rlrun export: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    if not args.stop and importlib.util.find_spec("fastapi") is None:
        raise SystemExit("rlrun: `rlrun dashboard` needs the serve extra (pip install 'rlrun[serve]')")
    return dashboard_cli.main(args)


def _eval(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.num_tasks is not None:
        overrides.append(f"orchestrator.eval.num_tasks={args.num_tasks}")
    runner = _load_module("rlrun.eval.runner", "`rlrun eval`")
    try:
        config = load_run_config(args.config, overrides)
        served = config
        if args.checkpoint is not None:  # the inference service it starts serves the checkpoint
            model = config.model.model_copy(update={"path": runner.model_dir(args.checkpoint)})
            served = config.model_copy(update={"model": model})
        started = set(SERVICES) - {"trainer"} - (set() if args.checkpoint else {"inference"})
        check_run(served, Scope(services=frozenset(started)))
    except ConfigError as error:
        return _invalid(error, "rlrun eval")
    name = args.checkpoint.resolve().name if args.checkpoint else "endpoint"
    request = runner.EvalRequest(
        config=config,
        config_path=args.config,
        overrides=overrides,
        checkpoint=args.checkpoint,
        endpoint=args.endpoint,
        endpoint_model=args.endpoint_model,
        api_key_env=args.api_key_env,
        output_dir=args.output_dir or config.run_dir / "eval" / name,
        progress=not args.no_progress,
    )
    try:
        return runner.run_eval_command(request)
    except ConfigError as error:
        print(f"rlrun eval: {error}", file=sys.stderr)
        return 2


def _operator(args: argparse.Namespace) -> int:
    if getattr(args, "operator_missing", False):
        raise SystemExit("rlrun: the operator is not available in this installation")
    return _load_module("rlrun.operator.cli", "the operator").main(args)


def _bench(args: argparse.Namespace) -> int:
    module, _ = BENCHMARKS[args.name]
    return _load_module(module, f"benchmark {args.name!r}").main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "check-config": _check_config,
        "serve": _serve,
        "local": _local,
        "eval": _eval,
        "dashboard": _dashboard,
        "export": _export,
        "operator": _operator,
        "bench": _bench,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
